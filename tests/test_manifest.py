import importlib.util
import subprocess

import pytest

from sparkbook.facts.manifest import describe_differences, manifest_differences, manifest_script, parse_manifest
from sparkbook.nodes.shell import SCRIPTS


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), SCRIPTS / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SCRIPT = _module("model_manifest.py")
RACY_S = SCRIPT.RACY_S


def _run(script) -> str:
    return subprocess.run(["bash", "-c", script.program()], capture_output=True, text=True, check=True).stdout


def test_manifest_lists_sizes_and_hashes_configs(tmp_path):
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "config.json").write_text('{"a": 1}')
    (tmp_path / "m" / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "m" / "sub" / "tokenizer.json").write_text("{}")
    m = parse_manifest(_run(manifest_script(str(tmp_path / "m"), hash_all=False)))
    assert m["model.safetensors"] == {"size": 10, "sha256": None}
    assert m["config.json"]["size"] == 8 and len(m["config.json"]["sha256"]) == 64
    assert m["sub/tokenizer.json"]["sha256"]
    full = parse_manifest(_run(manifest_script(str(tmp_path / "m"), hash_all=True)))
    assert full["model.safetensors"]["sha256"]
    other = {**m, "config.json": {**m["config.json"], "sha256": "0" * 64}}
    del other["sub/tokenizer.json"]
    assert describe_differences(manifest_differences(m, other)) == ["missing sub/tokenizer.json", "config.json (content differs)"]
    assert manifest_differences(m, None) == {n: "missing" for n in sorted(m)}
    assert parse_manifest(_run(manifest_script(str(tmp_path / "none"), False))) is None


def test_a_path_that_looks_like_an_option_is_a_path(tmp_path):
    (tmp_path / "-rf").mkdir()
    (tmp_path / "-rf" / "config.json").write_text("{}")
    import os
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        m = parse_manifest(_run(manifest_script("-rf", hash_all=False)))
    finally:
        os.chdir(old)
    assert set(m) == {"config.json"}


def test_the_manifest_leaves_out_the_downloads_bookkeeping(tmp_path):
    model = tmp_path / "m"
    (model / ".cache" / "huggingface" / "sparkbook").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "sparkbook" / "x.incomplete").write_bytes(b"partial")
    (model / ".cache" / "other.json").write_text("{}")
    (model / "config.json").write_text("{}")
    for hash_all in (True, False):
        m = parse_manifest(_run(manifest_script(str(model), hash_all)))
        assert set(m) == {"config.json", ".cache/other.json"} and m["config.json"]["sha256"]


def test_every_file_by_content_and_a_second_manifest_reads_nothing(tmp_path):
    """The digest cache, in a private folder: the second manifest reads no byte; a shard rewritten
    with the same size and its modification time set back (what `touch -d` or rsync -t leave) is
    read again, for its change time moved; a new file is read alone."""
    import os
    import time
    from sparkbook.facts.manifest import bytes_read
    model, private = tmp_path / "m", tmp_path / "work"
    model.mkdir()
    private.mkdir(mode=0o700)
    (model / "config.json").write_text("{}")
    shard = model / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"a" * 100_000)
    cache = str(private / "digests.json")
    time.sleep(RACY_S + 0.1)  # changed a moment ago: read every time (the racy rule's own test below)
    first = _run(manifest_script(str(model), True, cache))
    assert bytes_read(first) == (100_002, 2)
    assert (os.stat(cache).st_mode & 0o777) == 0o600
    second = _run(manifest_script(str(model), True, cache))
    assert bytes_read(second) == (0, 0) and parse_manifest(second) == parse_manifest(first)
    st = shard.stat()
    shard.write_bytes(b"a" * 99_999 + b"b")  # same size
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same modification time
    third = _run(manifest_script(str(model), True, cache))
    assert bytes_read(third) == (100_000, 1)
    assert manifest_differences(parse_manifest(first), parse_manifest(third)) == {shard.name: "content differs"}
    (model / "model-00002-of-00002.safetensors").write_bytes(b"c" * 10)
    time.sleep(RACY_S + 0.1)
    assert bytes_read(_run(manifest_script(str(model), True, cache))) == (100_010, 2)  # the racy shard too
    assert bytes_read(_run(manifest_script(str(model), True, cache))) == (0, 0)


def test_a_file_changed_just_before_the_manifest_is_read_again_by_the_next(tmp_path):
    """git's racily clean entries: a write in the same tick of the file system's clock as the
    listing leaves size and times alike, so a digest of a file changed within RACY_S of the
    manifest's start is not kept; a malformed cache entry is never trusted."""
    import json
    import time
    from sparkbook.facts.manifest import bytes_read
    model, private = tmp_path / "m", tmp_path / "work"
    model.mkdir()
    private.mkdir(mode=0o700)
    (model / "w.safetensors").write_bytes(b"x" * 1000)
    cache = private / "digests.json"
    for _ in range(2):
        assert bytes_read(_run(manifest_script(str(model), True, str(cache)))) == (1000, 1)
    assert json.loads(cache.read_text()) == {}
    time.sleep(RACY_S + 0.1)
    _run(manifest_script(str(model), True, str(cache)))
    entries = json.loads(cache.read_text())
    assert len(entries) == 1 and bytes_read(_run(manifest_script(str(model), True, str(cache)))) == (0, 0)
    key, entry = next(iter(entries.items()))
    for bad in ([*entry[:3], "not-a-digest"], entry[:3], [*map(str, entry[:3]), entry[3]], "x"):
        cache.write_text(json.dumps({key: bad}))
        out = _run(manifest_script(str(model), True, str(cache)))
        assert bytes_read(out) == (1000, 1) and parse_manifest(out)["w.safetensors"]["sha256"] == entry[3]


def test_an_unreadable_folder_is_an_error_not_a_shorter_list(tmp_path, monkeypatch):
    import os
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "w.json").write_text("{}")
    real = os.scandir

    def scandir(path="."):
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(SCRIPT.os, "scandir", scandir)
    with pytest.raises(PermissionError):
        SCRIPT.walk(str(tmp_path / "m"), ".sparkbook-partial")


def test_the_digest_cache_is_kept_only_in_a_private_folder_of_ones_own(tmp_path):
    from sparkbook.facts.manifest import bytes_read
    model, shared = tmp_path / "m", tmp_path / "shared"
    model.mkdir()
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (model / "w.safetensors").write_bytes(b"x" * 1000)
    for _ in range(2):  # nothing cached, so every run reads the file
        assert bytes_read(_run(manifest_script(str(model), True, str(shared / "digests.json")))) == (1000, 1)
    assert not (shared / "digests.json").exists()
    assert bytes_read(_run(manifest_script(str(model), True))) == (1000, 1)  # no cache named


def test_a_python_node_script_runs_isolated_with_its_values_as_arguments(tmp_path):
    s = manifest_script("/models/x; rm -rf /", True, "/tmp/c")
    assert s.argv()[:3] == ["python3", "-I", "-c"] and s.argv()[4:] == ["/models/x; rm -rf /", "all",
                                                                     ".sparkbook-partial", "/tmp/c"]
    assert "/models/x" not in s.text
    assert str(s).startswith("python3 -I sparkbook/scripts/model_manifest.py '/models/x; rm -rf /' all")
