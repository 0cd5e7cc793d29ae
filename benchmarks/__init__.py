"""The benchmarks: each module here is one measurement and its command line
(``python benchmarks/NAME.py`` from the checkout's root; results and how to read them in
benchmarks/README.md). They drive training, embedding, indexes and sweeps as a user would, through
the installed ``orchestrator`` package, which never imports them; the tests import them as
``benchmarks.NAME`` (pytest's ``pythonpath``) and check their arithmetic."""
