"""How the tests check that a class has a ``typing.Protocol``'s methods as declared (the store,
index and service seams: tests/stores/test_protocols.py, tests/serving/test_service_protocol.py)."""
import inspect


def protocol_methods(protocol) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def accepts(implementation: inspect.Signature, declared: inspect.Signature) -> bool:
    """Whether a method of ``implementation``'s signature can be called as ``declared`` says: the
    declared parameters in order (by name unless declared positional-only), anything more with a
    default."""
    have, want = list(implementation.parameters.values()), list(declared.parameters.values())
    return (len(have) >= len(want)
            and all(w.kind is inspect.Parameter.POSITIONAL_ONLY or h.name == w.name for h, w in zip(have, want))
            and all(p.default is not inspect.Parameter.empty for p in have[len(want):]))
