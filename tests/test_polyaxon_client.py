"""A failed Polyaxon call is one HarnessError line; an API busy with what it was just sent (405) is asked again."""

import pytest
from polyaxon.exceptions import ApiException

from harness import polyaxon_client
from harness.errors import HarnessError
from harness.polyaxon_client import polyaxon_call


class Answers:
    """A client call that fails with each of `failures` in turn, then returns 'created'."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "created"


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polyaxon_client, "BUSY_RETRY_INTERVAL_S", 0.0)
    monkeypatch.setattr(polyaxon_client, "BUSY_RETRY_S", 5.0)


def test_a_busy_answer_is_asked_again_until_the_call_is_taken() -> None:
    call = Answers(ApiException(status=405), ApiException(status=405))
    assert polyaxon_call("cannot tag this run", call) == "created"
    assert call.calls == 3  # two refusals, then the call


def test_only_a_busy_answer_is_asked_again() -> None:
    call = Answers(ApiException(status=404, reason="Not Found"))
    with pytest.raises(HarnessError, match=r"^cannot create run: ApiException \(404\)"):
        polyaxon_call("cannot create run", call)
    assert call.calls == 1


def test_a_busy_answer_past_the_deadline_is_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polyaxon_client, "BUSY_RETRY_S", 0.05)
    monkeypatch.setattr(polyaxon_client, "BUSY_RETRY_INTERVAL_S", 0.001)  # at most ~50 asks
    call = Answers(*[ApiException(status=405)] * 1000)
    with pytest.raises(HarnessError, match=r"^could not stop: ApiException \(405\)"):
        polyaxon_call("could not stop", call)
    assert 1 < call.calls < 1000
