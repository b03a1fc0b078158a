"""Call ids as the dispatch core knows them: unique per run of a task, and back."""

from blockx.actors import CallIds
from blockx.calls import CallSpec


def spec(call_id: str, function: str = "demo.add", args: bytes = b"\x90") -> CallSpec:
    return CallSpec(call_id=call_id, function=function, args=args)


def test_every_run_has_its_own_prefix_even_of_the_same_task_id() -> None:
    ids = CallIds()
    first, other, again = (ids.run_prefix(task_id) for task_id in ("t1", "t2", "t1"))
    assert [first, other, again] == ["t1#0:", "t2#1:", "t1#2:"]
    # A late answer of the first run can never be taken for one of the rerun.
    assert first + "c0" != again + "c0"


def test_a_subcall_id_names_executor_and_process_and_maps_back_once() -> None:
    ids = CallIds()
    core_id = ids.subcall("executor-0", 4242, "7")
    assert core_id == "executor-0#4242:7"
    # The same child id from another executor or process is another subcall.
    assert ids.subcall("executor-1", 4242, "7") == "executor-1#4242:7"
    assert ids.subcall("executor-0", 4243, "7") == "executor-0#4243:7"
    assert ids.executor_subcall_id(core_id) == "7"
    # The mapping ends with the result: a second lookup finds nothing to undo.
    assert ids.executor_subcall_id(core_id) == core_id
    assert ids.executor_subcall_id("executor-1#4242:7") == "7"
    assert ids.executor_subcall_id("executor-0#4243:7") == "7"


def test_an_id_the_core_never_gave_out_goes_back_unchanged() -> None:
    assert CallIds().executor_subcall_id("executor-0#1:9") == "executor-0#1:9"


def test_forget_executor_drops_only_that_process_s_stale_mappings() -> None:
    ids = CallIds()
    gone = [ids.subcall("executor-0", 100, str(n)) for n in range(3)]
    restarted = ids.subcall("executor-0", 101, "1")
    other = ids.subcall("executor-1", 100, "1")
    prefix_alike = ids.subcall("executor-0", 1000, "1")  # "executor-0#100" is its prefix too
    ids.forget_executor("executor-0", 100)
    for core_id in gone:
        assert ids.executor_subcall_id(core_id) == core_id  # forgotten: nothing maps back
    assert ids.executor_subcall_id(restarted) == "1"
    assert ids.executor_subcall_id(other) == "1"
    assert ids.executor_subcall_id(prefix_alike) == "1"


def test_forgetting_an_executor_without_subcalls_changes_nothing() -> None:
    ids = CallIds()
    core_id = ids.subcall("executor-0", 7, "1")
    ids.forget_executor("executor-9", 7)
    ids.forget_executor("executor-0", 8)
    assert ids.executor_subcall_id(core_id) == "1"
