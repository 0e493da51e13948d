"""`stream_seq`: the stream sequence read from a JetStream reply subject, as nats-py's `msg.metadata` reads it, in
both forms of the subject; a message that is not JetStream's is refused as nats-py refuses it."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from oneplus_bus.informer import stream_seq

V1 = "$JS.ACK.KV_jobs.oNeKqFhq2T.1.184467.2301.1765000000000000000.17"
V2 = "$JS.ACK._.AZ3H5EHR6.ONEPLUS_JOBS.preemption.2.99871.512.1765000000000000000.0.x1Yz"
V2_NO_TOKEN = "$JS.ACK.hub.AZ3H5EHR6.ONEPLUS_JOBS.preemption.1.42.41.1765000000000000000.3"


def msg(reply: str) -> Msg:
    return Msg(None, subject="oneplus.jobs.j-1.placed", reply=reply, data=b"{}", headers=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("reply", "seq"), [(V1, 184467), (V2, 99871), (V2_NO_TOKEN, 42)])
def test_reads_the_stream_sequence_as_nats_metadata_does(reply: str, seq: int) -> None:
    assert stream_seq(msg(reply)) == seq == msg(reply).metadata.sequence.stream


@pytest.mark.parametrize("reply", ["", "_INBOX.abc.def", "$JS.ACK.too.short", "$JS.API.CONSUMER.INFO.S.C.1.2.3"])
def test_a_message_that_is_not_jetstreams_is_refused(reply: str) -> None:
    with pytest.raises(NotJSMessageError):
        stream_seq(msg(reply))
