"""`blockx hub ...`: the operators' commands on a SQLite file, their settings and errors.

Each error exits 1 with one line naming the flag (or setting) that is wrong;
nothing is written to the database by a command that fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockx import cli, settings
from blockx.hub import HubConfig, Store, show_task

SUBMIT = ["--handler", "resize", "--handler-version", "2", "--payload-version", "1"]


def run(capsys: pytest.CaptureFixture[str], db: Path, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["hub", *argv, "--db", str(db)])
    out, err = capsys.readouterr()
    return code, out, err.strip()


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("HUB_DB", "HUB_LISTEN", "HUB_LEASE_MS", "HUB_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hub.sqlite3"


def test_a_queue_a_credential_a_task_and_its_history(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, db, "queue", "create", "images") == (0, "queue images created\n", "")
    assert run(capsys, db, "queue", "create", "images")[1] == "queue images exists already\n"
    code, token, _ = run(capsys, db, "credential", "create", "--queue", "images", "--rights",
                         "producer, worker")  # fmt: skip
    assert code == 0
    assert token.startswith("bxc_")
    code, out, _ = run(capsys, db, "submit", "--queue", "images", *SUBMIT, "--payload",
                       '{"image": "a.png", "scale": 1.10}', "--idempotent", "--max-attempts", "5",
                       "--task-id", "order-1")  # fmt: skip
    assert code == 0
    submitted = json.loads(out)
    assert (submitted["task_id"], submitted["state"]) == ("order-1", "QUEUED")
    assert (submitted["idempotency"], submitted["max_attempts"]) == ("IDEMPOTENT", 5)
    assert submitted["payload"] == {"image": "a.png", "scale": 1.1}
    assert '"payload": {"image": "a.png", "scale": 1.10},' in out  # as given
    code, out, _ = run(capsys, db, "task", "show", "order-1")
    assert code == 0
    shown = json.loads(out)
    assert [entry["kind"] for entry in shown["history"]] == ["SUBMITTED"]
    assert shown["attempts"] == []


def test_queues_listed_paused_and_resumed_credentials_listed_and_revoked(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "queue", "create", "images")
    token = run(capsys, db, "credential", "create", "--queue", "images", "--rights", "worker")[1]
    credential_id = token.removeprefix("bxc_").partition(".")[0]
    run(capsys, db, "submit", "--queue", "images", *SUBMIT, "--payload", "1")
    assert run(capsys, db, "queue", "pause", "images") == (0, "queue images paused\n", "")
    code, out, _ = run(capsys, db, "queue", "list")
    [queue] = json.loads(out)
    assert (code, queue["queue_id"], queue["paused"]) == (0, "images", True)
    assert (queue["tasks"]["QUEUED"], queue["tasks"]["SUCCEEDED"], queue["running"]) == (1, 0, 0)
    assert run(capsys, db, "queue", "resume", "images")[1] == "queue images resumed\n"
    assert json.loads(run(capsys, db, "queue", "list")[1])[0]["paused"] is False
    revoked = run(capsys, db, "credential", "revoke", credential_id)
    assert revoked == (0, f"credential {credential_id} revoked\n", "")
    code, out, _ = run(capsys, db, "credential", "list")
    assert json.loads(out) == [
        {
            "credential_id": credential_id,
            "queue_id": "images",
            "rights": ["worker"],
            "revoked": True,
            "created_at_ms": json.loads(out)[0]["created_at_ms"],
        }
    ]
    assert token.partition(".")[2] not in out  # never the secret


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["credential", "create", "--queue", "nope", "--rights", "worker"],
            "blockx: error: --queue 'nope': no such queue",
        ),
        (
            ["credential", "create", "--queue", "q", "--rights", "root"],
            "blockx: error: --rights 'root': comma-separated producer, worker, admin",
        ),
        (
            ["credential", "create", "--queue", "q", "--rights", " , "],
            "blockx: error: --rights ' , ': name at least one right",
        ),
        (["queue", "pause", "nope"], "blockx: error: QUEUE 'nope': no such queue"),
        (["credential", "revoke", "nope"], "blockx: error: ID 'nope': no such credential"),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", "{oops"],
            "blockx: error: --payload '{oops': JSON: payload: an object's key",
        ),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", '{"items": [{"price": NaN}]}'],
            'blockx: error: --payload \'{"items": [{"price": NaN}]}\': JSON: '
            "payload.items[0].price: a JSON number: RFC 8259 has no NaN",
        ),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", "[18446744073709551616]"],
            "blockx: error: --payload '[18446744073709551616]': JSON: payload[0]: an integer",
        ),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", "1", "--max-attempts", "0"],
            "blockx: error: --max-attempts 0: an integer from 1 to 100",
        ),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", "1", "--deadline-ms", "-5"],
            "blockx: error: --deadline-ms -5: an integer from 1 to",
        ),
        (
            ["submit", "--queue", "q", *SUBMIT, "--payload", "1", "--priority", "10"],
            "blockx: error: --priority 10: an integer from 0 to 9",
        ),
        (
            [
                "submit",
                "--queue",
                "q",
                *SUBMIT,
                "--payload",
                "1",
                "--deadline-ms",
                "10",
                "--delay-ms",
                "10",
            ],
            "blockx: error: --delay-ms 10: delay_ms must come before the task's total deadline",
        ),
        (
            ["queue", "limit", "q", "--max-running", "-1"],
            "blockx: error: --max-running -1: 0 (no limit) to",
        ),
        (
            ["queue", "limit", "nope", "--max-running", "1"],
            "blockx: error: QUEUE 'nope': no such queue",
        ),
        (
            ["submit", "--queue", "nope", *SUBMIT, "--payload", "1"],
            "blockx: error: --queue 'nope': no queue 'nope'",
        ),
        (["task", "show", "t9"], "blockx: error: TASK 't9': no such task"),
        (["--listen", "8090"], "blockx: error: listenAddr = '8090' (from --listen): must be"),
    ],
)
def test_errors_exit_1_naming_the_flag(
    db: Path, argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, db, "queue", "create", "q")[0] == 0
    code, out, err = run(capsys, db, *argv)
    assert (code, out) == (1, "")
    assert err.startswith(error), err
    store = Store(str(db))
    try:
        assert store.read(lambda tx: tx.tasks_of_queue("q", None, 10)) == []
        assert show_task(store, "t9") is None
    finally:
        store.close()


def test_a_task_with_a_priority_a_delay_and_a_limited_concurrency_key(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "queue", "create", "q")
    assert run(capsys, db, "queue", "limit", "q", "--max-running", "3")[1] == (
        "queue q: every key at most 3\n"
    )
    assert run(capsys, db, "queue", "limit", "q", "--key", "acct-7", "--max-running", "1")[1] == (
        "queue q: key 'acct-7' at most 1\n"
    )
    scheduling = ["--priority", "8", "--delay-ms", "60000", "--concurrency-key", "acct-7"]
    code, out, _ = run(capsys, db, "submit", "--queue", "q", *SUBMIT, "--payload", "1", *scheduling)
    assert code == 0
    task = json.loads(out)
    assert (task["priority"], task["concurrency_key"]) == (8, "acct-7")
    assert task["available_at_ms"] - task["created_at_ms"] == 60_000
    store = Store(str(db))
    try:
        limits = store.read(lambda tx: tx.key_limits("q", {"acct-7", "other"}))
    finally:
        store.close()
    assert limits == {"acct-7": 1, "other": 3}


def test_a_repeated_task_id_with_other_content_is_refused(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "queue", "create", "q")
    first = run(capsys, db, "submit", "--queue", "q", *SUBMIT, "--payload", "1", "--task-id", "t")
    again = run(capsys, db, "submit", "--queue", "q", *SUBMIT, "--payload", "1", "--task-id", "t")
    other = run(capsys, db, "submit", "--queue", "q", *SUBMIT, "--payload", "2", "--task-id", "t")
    assert first[0] == again[0] == 0
    assert json.loads(first[1]) == json.loads(again[1])
    assert other[0] == 1
    assert other[2] == "blockx: error: --task-id 't': task 't' exists with other content"


def test_a_bad_setting_in_the_environment_names_the_variable(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HUB_LEASE_MS", "soon")
    code, _, err = run(capsys, db, "queue", "create", "q")
    assert code == 1
    assert err == "blockx: error: leaseMs = 'soon' (from env HUB_LEASE_MS): must be an integer"


def test_a_database_that_cannot_be_opened_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, tmp_path / "file" / "hub.sqlite3", "queue", "create", "q")
    assert code == 1
    assert err.startswith("blockx: error: hub database ")
    assert len(err.splitlines()) == 1


def test_hub_help_lists_every_setting_with_its_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["hub", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    listed = {line.split()[0]: line.split()[1:] for line in settings.help_lines(HubConfig)}
    assert len(listed) == len(settings.table(HubConfig).settings) >= 11
    for declared in settings.table(HubConfig).settings:
        line = next(line for line in shown.splitlines() if line.split()[:1] == [declared.path])
        assert declared.env is not None
        assert line.split()[1:] == [declared.env, json.dumps(declared.default)]
    assert "--config FILE" in shown
    assert "HUB_CONFIG" in shown


def test_settings_come_from_the_config_file_and_flags_win_over_it(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.sqlite3"
    config = tmp_path / "hub.json"
    config.write_text(json.dumps({"db": str(other), "leaseMs": 5000}))
    code = cli.main(["hub", "queue", "create", "q", "--config", str(config)])
    assert (code, capsys.readouterr().out) == (0, "queue q created\n")
    assert other.exists()
    assert not db.exists()
    assert run(capsys, db, "queue", "create", "q", "--config", str(config))[:2] == (
        0,
        "queue q created\n",
    )
    assert db.exists()


def test_a_bad_config_file_names_the_file_and_the_key(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "hub.json"
    config.write_text(json.dumps({"leaseMS": 5000}))
    monkeypatch.setenv("HUB_CONFIG", str(config))
    code, _, err = run(capsys, db, "queue", "create", "q")
    assert code == 1
    assert err == (
        f"blockx: error: leaseMS = 5000 (from file {config}): is not a setting; "
        "did you mean 'leaseMs'?"
    )
    code, _, err = run(capsys, db, "queue", "create", "q", "--config", str(tmp_path / "none"))
    assert code == 1
    assert err.startswith(f"blockx: error: --config = '{tmp_path / 'none'}': the file cannot be")
    assert not db.exists()


def test_a_file_of_tasks_is_queued_a_line_each_in_one_go(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "queue", "create", "images")
    task = {"handler": "resize", "handler_version": "2", "payload_version": "1"}
    lines = [json.dumps({**task, "payload": {"n": n}, "task_id": f"t{n}"}) for n in range(1_005)]
    lines.insert(3, "")  # blank lines are skipped
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, db, "submit", "--queue", "images", "--file", str(tasks))
    assert (code, err) == (0, "")
    shown = [json.loads(line) for line in out.splitlines()]
    assert len(shown) == 1_005
    assert shown[3] == {"line": 5, "task_id": "t3", "status": 201}
    again = tmp_path / "again.jsonl"
    again.write_text(
        json.dumps({**task, "payload": {"n": 0}, "task_id": "t0"})
        + "\n"
        + json.dumps({**task, "payload": {"n": 9}, "task_id": "t1"})
        + "\n"
    )
    code, out, _ = run(capsys, db, "submit", "--queue", "images", "--file", str(again))
    assert code == 1  # one of them was refused
    first, second = (json.loads(line) for line in out.splitlines())
    assert first == {"line": 1, "task_id": "t0", "status": 200}
    assert (second["line"], second["field"]) == (2, "task_id")
    store = Store(str(db))
    try:
        assert show_task(store, "t1004") is not None
    finally:
        store.close()


def test_a_file_with_a_bad_line_queues_nothing_and_names_each_bad_line(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, db, "queue", "create", "images")
    good = '{"handler": "resize", "handler_version": "2", "payload_version": "1", "payload": 1}'
    tasks = tmp_path / "tasks.jsonl"
    nan = good.replace('"payload": 1', '"payload": {"x": NaN}')
    tasks.write_text(f"{good}\n{nan}\nnot json\n{good}\n")
    code, out, err = run(capsys, db, "submit", "--queue", "images", "--file", str(tasks))
    assert (code, out) == (1, "")
    errors = err.splitlines()
    assert errors[0].startswith("blockx: line 2: payload.x")
    assert errors[1].startswith("blockx: line 3: ")
    assert "2 bad line(s)" in errors[-1]
    code, _, err = run(capsys, db, "submit", "--queue", "images", "--file", str(tasks),
                       "--payload", "1")  # fmt: skip
    assert code == 1
    assert err.startswith("blockx: error: --payload '1': not with --file")
    code, out, _ = run(capsys, db, "submit", "--queue", "images", "--payload", "1")
    assert code == 1
    store = Store(str(db))
    try:
        assert store.read(lambda tx: tx.tasks_of_queue("images", None, 10)) == []
    finally:
        store.close()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["retry"], "blockx: error: TASK None: give a task or --queue"),
        (["cancel", "t1", "--queue", "q"], "blockx: error: TASK 't1': give a task or --queue"),
        (
            ["retry", "t1", "--state", "FAILED"],
            "blockx: error: --state 'FAILED': only with --queue",
        ),
        (["cancel", "t1", "--dry-run"], "blockx: error: --dry-run True: only with --queue"),
        (["resolve", "t1", "--succeeded", "{oops"], "blockx: error: --succeeded '{oops': JSON:"),
        (
            ["resolve", "t1", "--succeeded", "1", "--details", "{}"],
            "blockx: error: --details '{}': only with --failed",
        ),
        (
            ["resolve", "t1", "--failed", "X", "--details", "nope"],
            "blockx: error: --details 'nope'",
        ),
        (["list", "--queue", "q", "--credential-file", "/no/such/file"], "blockx: error: --cred"),
        (
            ["list", "--queue", "q", "--hub", "ftp://h"],
            "blockx: error: --hub 'ftp://h': the hub's address, e.g. http://127.0.0.1:8090",
        ),
        (["list", "--queue", "q"], "blockx: error: --hub 'http://127.0.0.1:9': cannot reach"),
    ],
)
def test_review_commands_name_the_flag_that_is_wrong_before_asking_a_hub(
    tmp_path: Path, argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    credential = tmp_path / "admin"
    credential.write_text("bxc_a.b\n")
    reach = ["--hub", "http://127.0.0.1:9", "--credential-file", str(credential)]
    code = cli.main(["hub", "task", argv[0], *reach, *argv[1:]])  # later flags win
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.strip().startswith(error), err
