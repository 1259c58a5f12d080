"""Whose socket answers on the server's port: the kernel's tables read, the probe's landing
socket chosen as the kernel chooses it, and the verdict."""

from __future__ import annotations

from supervisor.core.listener import (
    Listener,
    PortOwner,
    foreign_detail,
    judge_port,
    parse_listeners,
    reached,
)

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4343 1 0
   2: 0100007F:7530 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0
   3: garbage
"""
_ROW6 = "   {n}: {address}:{port} {zero}:0000 0A 0:0 00:00000000 00000000  0  0 {inode} 1 0"
TCP6 = "  sl  local_address remote_address st ... inode\n" + "\n".join(
    _ROW6.format(n=n, address=address, port=port, zero="0" * 32, inode=inode)
    for n, (address, port, inode) in enumerate(
        [("0" * 32, "7530", 5151), ("0" * 24 + "01000000", "1F90", 5252)]
    )
)


def test_the_listening_rows_are_read_with_their_addresses_ports_and_inodes():
    assert parse_listeners(TCP) == (
        Listener("127.0.0.1", 30000, 4242),
        Listener("0.0.0.0", 8080, 4343),
    )  # the established row (01) and the unparsable one are left out
    assert parse_listeners(TCP6) == (Listener("::", 30000, 5151), Listener("::1", 8080, 5252))


def test_the_probe_lands_on_the_socket_bound_to_its_address_before_a_wildcard():
    table = (Listener("0.0.0.0", 30000, 1), Listener("127.0.0.1", 30000, 2))
    assert reached(table, "127.0.0.1", 30000) == (Listener("127.0.0.1", 30000, 2),)
    assert reached(table, "10.0.0.5", 30000) == (Listener("0.0.0.0", 30000, 1),)
    assert reached(table, "127.0.0.1", 30001) == ()
    dual = (Listener("::", 30000, 3),)  # a dual-stack wildcard takes IPv4 too
    assert reached(dual, "127.0.0.1", 30000) == dual
    assert reached(table, "localhost", 30000) == table  # a name: any socket on the port


def test_the_port_is_ours_only_when_the_tree_holds_every_socket_the_probe_reaches():
    table = parse_listeners(TCP) + parse_listeners(TCP6)
    assert judge_port(table, frozenset({4242, 99}), "127.0.0.1", 30000).owner is PortOwner.OURS
    foreign = judge_port(table, frozenset({99}), "127.0.0.1", 30000)
    assert foreign.owner is PortOwner.FOREIGN
    assert foreign.foreign == (Listener("127.0.0.1", 30000, 4242),)
    nobody = judge_port(table, frozenset({4242}), "127.0.0.1", 31000)
    assert (nobody.owner, nobody.foreign) == (PortOwner.FOREIGN, ())
    assert judge_port(None, frozenset(), "127.0.0.1", 30000).owner is PortOwner.UNKNOWN


def test_the_detail_names_the_foreign_holder_or_says_it_cannot_be_seen():
    verdict = judge_port(parse_listeners(TCP), frozenset(), "127.0.0.1", 30000)
    named = foreign_detail("127.0.0.1", 30000, verdict, 777)
    assert "127.0.0.1:30000" in named
    assert "socket 4242, pid 777" in named
    assert "cannot see" in foreign_detail("127.0.0.1", 30000, verdict, None)
    none = judge_port(parse_listeners(TCP), frozenset(), "127.0.0.1", 31000)
    assert "no socket of the server's tree listens" in foreign_detail("h", 1, none, None)
