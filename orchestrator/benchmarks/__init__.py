"""The benchmarks' measurements (what ``benchmarks/*.py`` run from the command line; results and
how to read them in benchmarks/README.md). Top layer, beside the CLI: it drives training,
embedding, indexes and sweeps as a user would, and the tests check its arithmetic."""
