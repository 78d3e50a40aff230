import subprocess

from sparkbook.facts.manifest import describe_differences, manifest_differences, manifest_script, parse_manifest


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
