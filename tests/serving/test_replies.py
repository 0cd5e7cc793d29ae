"""What the ingress gets from a pool replica that failed: the replica's own exception, whose message
is one line, not Ray's wrapper, whose message is the remote traceback in terminal colours."""
import pytest
from ray.exceptions import RayTaskError

from orchestrator.serving.app import Reply


class Failed:
    """A deployment response whose replica raised ``error``."""

    def __init__(self, error: BaseException):
        self.error = error

    def result(self):
        raise self.error


def test_a_replica_error_reaches_the_ingress_as_the_replica_raised_it():
    cause = ValueError("serving generation 'nope' is not in the lineage (known: ['g0-old'])")
    wrapped = RayTaskError("plan", "Traceback (most recent call last):\n  \x1b[36mray::plan\x1b[39m …", cause)
    with pytest.raises(ValueError) as raised:
        Reply(Failed(wrapped.as_instanceof_cause())).result()
    assert raised.value is cause and "Traceback" not in str(raised.value)


def test_other_failures_and_answers_pass_through():
    with pytest.raises(TimeoutError):
        Reply(Failed(TimeoutError("no answer"))).result()

    class Answered:
        def result(self):
            return 42

    assert Reply(Answered()).result() == 42


def test_answers_are_one_line_of_ascii_json_whatever_they_hold():
    import json

    from orchestrator.serving.app import encode_json

    plain = {"results": [[{"id": 3, "distance": 0.1 + 0.2, "uri": "s3://b/x.png"}]], "k": 1}
    assert encode_json(plain) == json.dumps(plain, separators=(",", ":")).encode()  # orjson's bytes, the same text
    for payload in ({"uri": "s3://b/é.png"}, {"error": "generation '\ud800' unknown"}):
        encoded = encode_json(payload)
        assert encoded.isascii() and b"\n" not in encoded
        assert json.loads(encoded) == payload
