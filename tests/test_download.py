"""dsx download against loopback hubs only: olah (a real Hub mirror, offline) and a fault-injecting fake.

Reference for every check: the bytes of the tiny checkpoint written by `write_tiny`,
and the fake hub's request log (what was asked for, with which Range).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from download_server import FakeHub, Fault, git_mirror

from ds_export.cli.app import main
from ds_export.download import DownloadError, Options, download, engine
from ds_export.io.checkpoint import Checkpoint

REPO = "org/tiny"
SHARD = "model-00003-of-00006.safetensors"


@pytest.fixture(scope="module")
def source(tiny_fp8) -> dict[str, bytes]:
    """The repo's files: the tiny checkpoint (config, index, 6 shards, tokenizer, generation config)."""
    return {p.name: p.read_bytes() for p in sorted(tiny_fp8.iterdir()) if p.is_file()}


@pytest.fixture
def fake(source, monkeypatch):
    with FakeHub() as hub:
        hub.commit(REPO, source, plain=("model-00004-of-00006.safetensors",))  # one shard outside LFS
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield hub


def mtp_shards(source) -> set[str]:
    """Independent reference: shards holding names of layer num_hidden_layers (the config's MTP layer)."""
    n = json.loads(source["config.json"])["num_hidden_layers"]
    wm = json.loads(source["model.safetensors.index.json"])["weight_map"]
    return {f for name, f in wm.items() if name.startswith(f"model.layers.{n}.")}


def assert_same(dest: Path, source: dict[str, bytes], names) -> None:
    for n in names:
        assert (dest / n).read_bytes() == source[n], n


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(["download", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def lib(dest, **kw) -> dict:
    return download(REPO, dest, Options(backoff_s=0.01, **kw))


# ------------------------------------------------------------- olah (real mirror) ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def olah(source, tmp_path_factory):
    if importlib.util.find_spec("olah") is None:
        pytest.skip("olah is not installed (pip install 'olah==0.5.4', part of the test extra)")
    tmp = tmp_path_factory.mktemp("olah")
    git_mirror(tmp / "mirrors", REPO, source, plain=("model-00004-of-00006.safetensors",))
    port = _free_port()
    (tmp / "olah.toml").write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{tmp / "cache"}"\n'
        f'mirrors-path = ["{tmp / "mirrors"}"]\n\n[accessibility]\noffline = true\n')
    log = open(tmp / "olah.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "olah.server", "-c", str(tmp / "olah.toml"),
                             "--log-path", str(tmp / "logs")], stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"olah did not start: {(tmp / 'olah.log').read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_olah_happy_path_then_quantize_source(olah, source, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", olah)
    dest = tmp_path / "tiny"
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert sorted(res["downloaded"]) == sorted(source) and res["already_complete"] == 0
    assert res["bytes_downloaded"] == sum(len(b) for b in source.values())
    assert_same(dest, source, source)
    with Checkpoint.open(dest) as ck:  # what `dsx quantize` opens
        assert len(ck.shards) == 6
    assert main(["inspect", str(dest), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mtp_layers"] == [3]
    # a second run trusts the record and fetches nothing
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest), "--json")
    assert rc == 0 and json.loads(out)["downloaded"] == [] and json.loads(out)["already_complete"] == len(source)


def test_olah_only_config(olah, source, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", olah)
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "m"), "--only", "config", "--json")
    assert rc == 0, err
    want = {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json"}
    assert set(json.loads(out)["downloaded"]) == want
    assert {p.name for p in (tmp_path / "m").iterdir() if not p.name.startswith(".")} == want


def test_olah_ignores_ranges_so_a_partial_restarts(olah, source, tmp_path, monkeypatch):
    from ds_export.download.state import partial_path

    monkeypatch.setenv("HF_ENDPOINT", olah)
    dest = tmp_path / "d"
    part = partial_path(dest, SHARD, hashlib.sha256(source[SHARD]).hexdigest())
    part.parent.mkdir(parents=True)
    part.write_bytes(b"x" * 1000)  # wrong bytes: kept only if a server honoured the range (olah does not)
    res = lib(dest, include=(SHARD,), only="config")
    assert SHARD in res["downloaded"]
    assert res["resumed"] == {} and not part.exists()
    assert_same(dest, source, [SHARD])


# ------------------------------------------------------------- fault injection ----

@pytest.mark.parametrize("repo", ["a/b/c", "", "deepseek-ai/DeepSeek-R1/", "deepseek ai/R1"])
def test_a_malformed_repo_id_is_one_line_before_anything(repo, tmp_path, capsys):
    """huggingface_hub's HFValidationError reached the user as an internal error (for 'a/b/c', '', a trailing
    slash); now a usage error naming the id, before any request or directory."""
    assert main(["download", repo, "--local-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"{repo!r}: not a Hugging Face repo id" in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


def test_fake_hub_happy_path_and_selection(fake, source, tmp_path, capsys):
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "all"), "--json")
    assert rc == 0, err
    assert_same(tmp_path / "all", source, source)
    state = json.loads((tmp_path / "all" / ".dsx-download.json").read_text())
    assert state["commit"] == fake.repos[REPO].branches["main"]
    assert all(r["verified"] for r in state["files"].values()) and len(state["files"]) == len(source)
    assert not (tmp_path / "all" / ".dsx-download").exists()  # no partials left


@pytest.mark.parametrize("files", [["config.json"], {"config.json": "x"}, 5])
def test_a_damaged_download_record_is_one_line(fake, source, tmp_path, capsys, files):
    """.dsx-download.json whose files are not records (a list, a string record) was an internal error on the next
    run; it is one line saying how to start the verification over, and nothing is fetched."""
    dest = tmp_path / "d"
    assert cli(capsys, REPO, "--local-dir", str(dest), "--only", "config")[0] == 0
    p = dest / ".dsx-download.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "files": files}))
    n = len(fake.gets("*"))
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest))
    assert rc == 1 and "unreadable download record" in err and "delete it" in err, err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err
    assert len(fake.gets("*")) == n


def test_a_second_download_into_the_same_directory_is_refused_while_the_first_runs(fake, source, tmp_path, capsys):
    """Two downloads into one directory appended to the same partial files: the second is refused at once while
    another process holds the directory's lock, and runs once it is gone."""
    from dir_lock import held_by_another_process

    dest = tmp_path / "d"
    dest.mkdir()
    with held_by_another_process(dest):
        rc, out, err = cli(capsys, REPO, "--local-dir", str(dest))
        assert rc == 2 and "another dsx process is writing or reading it now (dsx download" in err, err
        assert list(dest.iterdir()) == []
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest))
    assert rc == 0, err
    assert_same(dest, source, source)


def test_only_mtp_fetches_only_the_mtp_shards(fake, source, tmp_path, capsys):
    want = mtp_shards(source)
    assert want and len(want) < 6  # the reference must be able to tell the difference
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "mtp"), "--only", "mtp", "--json")
    assert rc == 0, err
    assert set(json.loads(out)["shards"]) == want
    got = {e["file"] for e in fake.gets("*.safetensors")}
    assert got == want
    assert {p.name for p in (tmp_path / "mtp").glob("*.safetensors")} == want
    assert_same(tmp_path / "mtp", source, want)


def test_only_base_is_the_complement(fake, source, tmp_path):
    res = lib(tmp_path / "b", only="base")
    wm = json.loads(source["model.safetensors.index.json"])["weight_map"]
    n = json.loads(source["config.json"])["num_hidden_layers"]
    base = {f for name, f in wm.items() if not name.startswith(f"model.layers.{n}.")}
    assert set(res["shards"]) == base


def _partial(dest: Path, name: str) -> list[Path]:
    return list((dest / ".dsx-download" / "partial").glob(name + ".*.part"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killed_mid_file_resumes_from_the_partial_bytes(fake, source, tmp_path, sig):
    """SIGTERM (a scheduler stopping the job) is handled as Ctrl-C, exit 143; SIGKILL leaves the partial as is."""
    at = 1_000_003  # an odd offset inside the shard
    fake.faults.append(Fault(SHARD, "stall", at=at, times=-1))  # retries stall too: the shard cannot finish
    dest = tmp_path / "d"
    env = dict(os.environ, HF_ENDPOINT=fake.url)
    proc = subprocess.Popen([sys.executable, "-m", "ds_export.cli.app", "download", REPO, "--local-dir", str(dest),
                             "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert fake.stalled.wait(30), "the download never reached the stalled shard"
        deadline = time.monotonic() + 10
        while not (_partial(dest, SHARD) and _partial(dest, SHARD)[0].stat().st_size == at):
            assert time.monotonic() < deadline, "partial never reached the stall offset"
            time.sleep(0.02)
        proc.send_signal(sig)
        if sig != signal.SIGKILL:
            fake.release.set()  # stalled connections close; the worker retries until it sees the stop flag
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    if sig != signal.SIGKILL:
        assert proc.returncode == (130 if sig == signal.SIGINT else 143), (proc.returncode, err)
        assert "interrupted" in err and len(err.strip().splitlines()) == 1, err
    assert not (dest / SHARD).exists() and _partial(dest, SHARD)[0].stat().st_size == at
    fake.faults.clear()
    n_before = len(fake.log)
    res = lib(dest)
    rerun = [e for e in fake.log[n_before:] if e["method"] == "GET" and e["file"]]
    assert res["resumed"][SHARD] == at  # other shards may have been in flight too (8 workers)
    for f, n in res["resumed"].items():  # each partial continued at its own length, none restarted
        want = [] if n == len(source[f]) else [(f"bytes={n}-", 206)]
        assert [(e["range"], e["status"]) for e in rerun if e["file"] == f] == want, f
    assert res["bytes_downloaded"] == sum(len(source[f]) for f in res["downloaded"]) - sum(res["resumed"].values())
    assert_same(dest, source, source)
    assert not (dest / ".dsx-download").exists()


def test_ctrl_c_while_waiting_for_workers_is_a_flag_checked_at_one_point():
    """interrupt.ctrl_c_as_flag (dsx download and dsx quantize): in the main thread with Python's own handler, a SIGINT
    sets the flag instead of raising wherever the thread is (inside concurrent.futures.wait it could leave a future's
    lock held and the pool's shutdown hanging); the handler is put back after. Off the main thread, or with a handler of the caller's, nothing changes."""
    import threading

    from ds_export.interrupt import ctrl_c_as_flag

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with ctrl_c_as_flag() as hit:
        assert not hit()
        os.kill(os.getpid(), signal.SIGINT)  # (no KeyboardInterrupt here)
        deadline = time.monotonic() + 5
        while not hit():
            assert time.monotonic() < deadline, "the flag was never set"
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    seen = []
    t = threading.Thread(target=lambda: seen.append(ctrl_c_as_flag().__enter__()()))
    t.start()
    t.join()
    assert seen == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_dropped_connections_are_retried_with_range(fake, source, tmp_path):
    fake.faults += [Fault(SHARD, "cut", at=700_000), Fault(SHARD, "cut", at=1_500_000)]
    res = lib(tmp_path / "d", workers=2)
    assert [e["range"] for e in fake.gets(SHARD)] == [None, "bytes=700000-", "bytes=1500000-"]
    assert res["bytes_downloaded"] == sum(len(b) for b in source.values())
    assert_same(tmp_path / "d", source, source)


def test_resume_through_a_cdn_redirect(fake, source, tmp_path):
    fake.redirect_lfs = True
    fake.faults.append(Fault(SHARD, "cut", at=800_001))
    lib(tmp_path / "d")
    got = [(e["path"].split("/")[1], e["range"], e["status"]) for e in fake.gets(SHARD)]
    assert got == [("org", None, 302), ("cdn", None, 200), ("org", "bytes=800001-", 302),
                   ("cdn", "bytes=800001-", 206)]
    assert_same(tmp_path / "d", source, source)


def test_server_ignoring_range_restarts_the_file(fake, source, tmp_path):
    fake.faults += [Fault(SHARD, "cut", at=600_000), Fault(SHARD, "ignore_range")]
    res = lib(tmp_path / "d")
    assert [(e["range"], e["status"]) for e in fake.gets(SHARD)] == [(None, 200), ("bytes=600000-", 200)]
    assert res["resumed"] == {} and res["bytes_downloaded"] == sum(len(b) for b in source.values()) + 600_000
    assert_same(tmp_path / "d", source, [SHARD])


def test_corrupted_download_is_detected_and_refetched(fake, source, tmp_path):
    fake.faults.append(Fault(SHARD, "corrupt", at=123_457))
    res = lib(tmp_path / "d")
    assert res["refetched"] == {SHARD: 1} and len(fake.gets(SHARD)) == 2
    assert_same(tmp_path / "d", source, source)


def test_corrupted_small_file_checked_by_git_blob_id(fake, source, tmp_path):
    fake.faults.append(Fault("tokenizer.json", "corrupt", at=10))
    res = lib(tmp_path / "d")
    assert res["refetched"] == {"tokenizer.json": 1}
    assert_same(tmp_path / "d", source, ["tokenizer.json"])


def test_persistent_corruption_fails_clearly_and_leaves_nothing(fake, source, tmp_path, capsys):
    fake.faults.append(Fault(SHARD, "corrupt", at=5, times=-1))
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "d"), "--quiet")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    want = hashlib.sha256(source[SHARD]).hexdigest()
    assert SHARD in err and "sha256" in err and want in err and "Traceback" not in err
    assert len(fake.gets(SHARD)) == 3  # first try + 2 refetches
    assert not (tmp_path / "d" / SHARD).exists() and not _partial(tmp_path / "d", SHARD)


def test_no_verify_skips_the_hash(fake, source, tmp_path):
    fake.faults.append(Fault(SHARD, "corrupt", at=5_000))
    res = lib(tmp_path / "d", verify=False)
    assert res["refetched"] == {}  # planted fault: only verification could have caught it
    assert (tmp_path / "d" / SHARD).read_bytes() != source[SHARD]
    # a verifying rerun does not trust unverified files: it finds and replaces the bad one
    res = lib(tmp_path / "d")
    assert res["downloaded"] == [SHARD]
    assert_same(tmp_path / "d", source, source)


@pytest.mark.parametrize("delta", [+100, -100])
def test_size_lies_are_caught(fake, source, tmp_path, delta):
    fake.faults.append(Fault(SHARD, "size", delta=delta, times=-1))
    with pytest.raises(DownloadError, match=f"sends {len(source[SHARD]) + delta} bytes.*says {len(source[SHARD])}"):
        lib(tmp_path / "d")
    assert not (tmp_path / "d" / SHARD).exists()


def test_corrupted_local_file_is_replaced(fake, source, tmp_path):
    dest = tmp_path / "d"
    lib(dest)
    p = dest / SHARD
    b = bytearray(p.read_bytes())
    b[-1] ^= 1
    p.write_bytes(bytes(b))  # same size, new mtime: no longer trusted
    n = len(fake.gets(SHARD))
    res = lib(dest)
    assert res["downloaded"] == [SHARD] and len(fake.gets(SHARD)) == n + 1
    assert_same(dest, source, [SHARD])


def test_a_differing_file_no_dsx_download_recorded_is_not_deleted_without_replace(fake, source, tmp_path, capsys):
    """A file in --local-dir that no dsx download fetched and that differs from the hub's was deleted and fetched
    again: DeepSeek-V3 asked into a directory holding R1 (the same names and sizes) deleted R1 shard by shard. The
    run stops before deleting it, naming the file; --replace fetches the hub's in its place."""
    dest = tmp_path / "d"
    dest.mkdir()
    other = bytearray(source[SHARD])
    other[-1] ^= 1  # (another checkpoint's shard: same name, same size)
    (dest / SHARD).write_bytes(bytes(other))
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest))
    assert rc == 2 and f"{dest / SHARD} differs from the hub's (hash), and no dsx download recorded it" in err, err
    assert "pass --replace" in err and (dest / SHARD).read_bytes() == bytes(other) and not fake.gets(SHARD)
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest), "--replace")
    assert rc == 0, err
    assert_same(dest, source, source)


def test_dsx_run_says_how_to_replace_a_differing_source_file(fake, source, tmp_path, capsys):
    """dsx run has no --replace: its download step names the dsx download command that has."""
    wd = tmp_path / "wd"
    (wd / "source").mkdir(parents=True)
    other = bytearray(source[SHARD])
    other[0] ^= 1
    (wd / "source" / SHARD).write_bytes(bytes(other))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nmodel: {{repo: {REPO}}}\nquantize: {{type: bf16}}\nexport: {{tp: 1}}\n")
    assert main(["run", str(recipe), "--workdir", str(wd), "--until-step", "download", "-q"]) == 2
    err = capsys.readouterr().err
    assert f"dsx download {REPO} --local-dir {wd / 'source'} --replace" in err and "pass --replace" not in err, err
    assert (wd / "source" / SHARD).read_bytes() == bytes(other)


def test_existing_good_files_are_adopted_without_fetching(fake, source, tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / SHARD).write_bytes(source[SHARD])  # e.g. from an earlier `hf download`
    res = lib(dest)
    assert SHARD not in res["downloaded"] and not fake.gets(SHARD)


def test_stale_partials_are_dropped_and_unselected_ones_kept(fake, source, tmp_path):
    from ds_export.download.state import partial_path

    dest = tmp_path / "d"
    sha = hashlib.sha256(source[SHARD]).hexdigest()
    mine = partial_path(dest, SHARD, sha)
    mine.parent.mkdir(parents=True)
    mine.write_bytes(source[SHARD][:1000])
    stale = partial_path(dest, SHARD, "0" * 64)  # same file, content of another commit
    stale.write_bytes(b"old")
    lib(dest, only="config")
    assert mine.exists() and not stale.exists()  # the shard was not selected: its partial waits
    res = lib(dest)
    assert res["resumed"] == {SHARD: 1000} and not mine.exists()


def test_revision_moved_between_runs(fake, source, tmp_path, capsys):
    dest = tmp_path / "d"
    old = fake.repos[REPO].branches["main"]
    lib(dest, only="config")
    changed = dict(source)
    changed["config.json"] = source["config.json"].replace(b'"use_cache": true', b'"use_cache": false')
    assert changed["config.json"] != source["config.json"]
    new = fake.commit(REPO, changed)
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest), "--quiet")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert old[:12] in err and new[:12] in err and f"--revision {old}" in err
    assert not fake.gets("*.safetensors")  # nothing mixed in
    rc, out, err = cli(capsys, REPO, "--local-dir", str(dest), "--revision", old, "--json")
    assert rc == 0, err
    assert json.loads(out)["commit"] == old
    assert_same(dest, source, source)  # the old commit's files, config.json included


def test_out_of_disk_space_fails_before_any_shard(fake, source, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(engine, "free_bytes", lambda p: 1_000_000)  # index + config fit, shards do not
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "d"), "--quiet")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert "but only 976.56 KiB free there" in err and "nothing was fetched" in err  # (units as df -h, as elsewhere)
    assert not fake.gets("*.safetensors")
    assert not list((tmp_path / "d").glob("*.safetensors"))


@pytest.mark.parametrize("args,msg", [
    ([ "org/nope"], "repository org/nope not found"),
    ([REPO, "--revision", "nope"], "revision 'nope' not found"),
])
def test_not_found_is_one_line(fake, tmp_path, capsys, args, msg):
    rc, out, err = cli(capsys, *args, "--local-dir", str(tmp_path / "d"))
    assert rc == 1 and msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unreachable_endpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "d"))
    assert rc == 1 and "cannot reach http://127.0.0.1:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_file_listed_by_index_but_missing(fake, source, tmp_path, capsys):
    fake.commit(REPO, {k: v for k, v in source.items() if k != SHARD})
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "d"))
    assert rc == 1 and f"lists {SHARD}" in err and "does not hold" in err
    assert not fake.gets("*.safetensors")


def test_file_not_found_at_resolve(fake, tmp_path, capsys):
    fake.faults.append(Fault(SHARD, "status", status=404, times=-1))
    rc, out, err = cli(capsys, REPO, "--local-dir", str(tmp_path / "d"), "--quiet")
    assert rc == 1 and f"file '{SHARD}' not found" in err and len(err.strip().splitlines()) == 1


def test_server_errors_are_retried_then_reported(fake, source, tmp_path):
    fake.faults.append(Fault(SHARD, "status", status=503, times=2))
    lib(tmp_path / "d")
    assert [e["status"] for e in fake.gets(SHARD)] == [503, 503, 200]
    fake.faults.append(Fault(SHARD, "status", status=503, times=-1))
    with pytest.raises(DownloadError, match="HTTP 503.*gave up after 2 retries"):
        lib(tmp_path / "e", retries=2)


def test_include_exclude_nested_and_empty_files(fake, source, tmp_path):
    files = dict(source, **{"figures/a.bin": b"\x01" * 3000, "figures/empty.txt": b""})
    fake.commit(REPO, files)
    res = lib(tmp_path / "d", only="config", include=("figures/*",), exclude=("tokenizer*",))
    assert set(res["downloaded"]) == {"config.json", "generation_config.json", "model.safetensors.index.json",
                                      "figures/a.bin", "figures/empty.txt"}
    assert_same(tmp_path / "d", files, ["figures/a.bin", "figures/empty.txt"])


def test_index_pointing_outside_the_directory_is_refused(fake, source, tmp_path):
    index = json.loads(source["model.safetensors.index.json"])
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../evil.safetensors"
    fake.commit(REPO, dict(source, **{"model.safetensors.index.json": json.dumps(index).encode()}))
    with pytest.raises(DownloadError, match="'../evil.safetensors', not a relative file name"):
        lib(tmp_path / "d")
    assert not (tmp_path / "evil.safetensors").exists()


def test_usage_errors(fake, tmp_path, capsys):
    rc, out, err = cli(capsys, REPO, "--only", "draft", "--local-dir", str(tmp_path / "d"))
    assert rc == 2 and "--only draft" in err
    rc, out, err = cli(capsys, REPO, "--include", "nothing*", "--local-dir", str(tmp_path / "d"))
    assert rc == 2 and "matches no file" in err
