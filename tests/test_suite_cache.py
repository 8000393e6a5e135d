"""The suite's own cache: a test run leaves the user's ~/.cache as it found it."""

from pathlib import Path

from quickdraft.models.loading import default_cache_dir


def test_the_suite_caches_in_a_folder_of_its_own_not_in_the_users_home():
    cache = default_cache_dir()
    assert not cache.is_relative_to(Path.home() / ".cache")
    assert cache.parent.name.startswith("quickdraft-tests-")
