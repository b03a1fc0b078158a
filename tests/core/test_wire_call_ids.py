"""Wire call ids carry the attempt, whatever the call id contains."""

from blockx.actors import split_wire_call_id, wire_call_id


def test_a_wire_id_names_call_and_attempt_even_with_slashes_in_the_call_id() -> None:
    assert wire_call_id("a/b", 3) == "a/b/3"
    assert split_wire_call_id("a/b/3") == ("a/b", 3)
    assert split_wire_call_id(wire_call_id("c0", 1)) == ("c0", 1)
