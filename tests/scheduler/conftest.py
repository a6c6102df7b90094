import pytest

from scheduler_helpers import build_request, build_scheduler


@pytest.fixture
def make_scheduler():
    return build_scheduler


@pytest.fixture
def make_request():
    return build_request

