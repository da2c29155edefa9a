"""The trajectory bus on NATS JetStream: one work-queue stream per job, a publisher and a consumer.

Rollout replicas use `Publisher`; trainer rank 0 uses `Consumer`; both call `ensure_stream` first (it is
idempotent, so whichever starts first creates the stream). Stream per job (`subjects.stream_name`):

- retention work-queue: a message leaves the stream when the trainer acks it, and the trainer acks
  only after the optimizer step that used it (trainer/loop.py), so a crash in between redelivers it;
- max_msgs = spec.async.queue.maxSize; whenFull dropOldest -> discard old (the server drops the oldest;
  the trainer derives the count, see `queue_full_drops`), block -> discard new: the server refuses the
  publish and the publisher backs off exponentially until there is room (counted as backoffs and
  blocked seconds), so nothing is lost and generation slows to the trainer's pace;
- file storage; every publish carries `Nats-Msg-Id: <trajectory id>` so a retried publish inside the
  duplicate window is stored once.

Both sides connect with `connect` (through `bus.access`, which adds the job's credentials and words the
errors), which rides through a NATS restart or outage: the client reconnects without limit, a publish
nobody answered is sent again with the same `Nats-Msg-Id` (stored once: the first attempt may have gone
through), a fetch returns nothing, acks wait in the client's buffer. A server that refuses the
credentials at the first connect ends it at once (`Refused`): no retry can change its answer.

The consumer is a durable pull consumer. On open it is deleted and re-created, which makes the server
deliver every message still in the stream at once - including those a crashed trainer had pulled but
not acked - instead of after `ack_wait`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Iterable
from typing import Any, Literal

import nats
import nats.aio.client
import nats.errors
import nats.js
import nats.js.api
import nats.js.errors

from asyncrl_workloads import metrics as metrics_mod
from asyncrl_workloads.bus import codec, subjects
from asyncrl_workloads.bus import trajectory as trajectory_mod

log = logging.getLogger(__name__)
WhenFull = Literal["dropOldest", "block"]
_JS_STREAM_FULL = 10077  # JSStreamStoreFailedF: "maximum messages exceeded" under discard new
RECONNECT_WAIT_S = 1.0
FIRST_CONNECT_ATTEMPTS = 3
"""A bus that is not there at start is tried this many times more, `RECONNECT_WAIT_S` apart, then
the process exits with one line (its pod restarts); once connected, reconnects have no limit."""
PING_INTERVAL_S = 10.0
"""With 3 pings outstanding: a bus that went silent (a partitioned node) is noticed within ~30 s, not
nats-py's default 4 min."""
NO_ANSWER = (TimeoutError, nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError)
"""What a JetStream request (publish, stream info) or a flush raises while the bus is down or
restarting (nats-py's TimeoutError and FlushTimeoutError are TimeoutErrors)."""


class Refused(Exception):
    """The server refused the client's credentials, or asked for some it did not get (its own words)."""


def refusal(exc: BaseException) -> str | None:
    """The server's words if ``exc`` is an authentication refusal (nats-py raises a plain ``Error`` with
    the server's -ERR text at connect, ``AuthorizationError`` once connected), else None."""
    if isinstance(exc, nats.errors.AuthorizationError):
        return "Authorization Violation"
    text = str(exc) if isinstance(exc, nats.errors.Error) else ""
    lowered = text.lower()
    if "authorization violation" in lowered or "authentication" in lowered:
        return text.removeprefix("nats: ").strip().strip("'")
    return None


async def connect(url: str, credentials: str | None = None, **options: Any) -> nats.aio.client.Client:
    """Connect to the job's bus; after that, stay connected through a NATS restart or outage.
    ``credentials``: a NATS ``.creds`` file presented on every (re)connect. ``options`` (nats-py's)
    override the settings below.

    The first connect fails after `FIRST_CONNECT_ATTEMPTS` more tries (the callers turn that into
    one clear line). Later the client reconnects every `RECONNECT_WAIT_S` without limit, logging
    the loss and the return once each, not every refused attempt: in a cluster the NATS pod comes
    back (its JetStream store on a volume), and a rollout or trainer that gave up would only be
    restarted by the kubelet into the same outage, losing its in-flight work. Measured against a
    real nats-server stopped for 6-10 s: a publish raises nats' TimeoutError after 5 s (and its
    message is sent after the reconnect), a fetch returns nothing, an ack waits in the client's
    buffer, stream info times out.

    A refusal of the credentials at the first connect raises `Refused` at once (the client closed);
    later, while reconnecting, it is logged once per outage and the client keeps trying (a server
    restarted before its resolver has the account refuses for a while, then lets the client in).
    """
    lost_at: list[float] = []
    made: list[nats.aio.client.Client] = []  # the callbacks also run during the first connect
    refused_warned: list[bool] = []

    async def disconnected() -> None:
        if not made or made[0].is_closed:  # a first connect that failed, or our own close
            return
        lost_at[:] = [time.monotonic()]
        log.warning("bus: lost the connection to %s; reconnecting every %g s", url, RECONNECT_WAIT_S)

    async def reconnected() -> None:
        away = time.monotonic() - lost_at[0] if lost_at else 0.0
        refused_warned.clear()
        log.warning("bus: reconnected to %s after %.1f s", url, away)

    async def error(exc: Exception) -> None:
        refused = refusal(exc)
        if refused is not None and not made:  # the first connect: nats-py raises this out of connect
            raise Refused(refused)
        if refused is not None and not refused_warned:
            refused_warned.append(True)
            log.warning("bus: %s refused the credentials: %s; trying again", url, refused)
            return
        # the server going away (EOF, reset) and every refused attempt until it is back: the
        # disconnected/reconnected lines say it once
        if isinstance(exc, nats.errors.UnexpectedEOF | ConnectionError) or not (
            made and made[0].is_connected
        ):
            log.debug("bus: %s: %s", type(exc).__name__, exc)
        else:
            log.warning("bus: %s: %s", type(exc).__name__, exc)

    settings: dict[str, Any] = {
        "connect_timeout": 5,
        "allow_reconnect": True,
        # for the first connect: nats-py retries it as a reconnect, for good with -1 (never raising)
        "max_reconnect_attempts": FIRST_CONNECT_ATTEMPTS,
        "reconnect_time_wait": RECONNECT_WAIT_S,
        "ping_interval": PING_INTERVAL_S,
        "max_outstanding_pings": 3,
        "disconnected_cb": disconnected,
        "reconnected_cb": reconnected,
        "error_cb": error,
    }
    if credentials is not None:
        settings["user_credentials"] = credentials
    nc = nats.aio.client.Client()
    try:
        await nc.connect(url, **{**settings, **options})
    except Refused:
        await nc.close()
        raise
    nc.options["max_reconnect_attempts"] = -1  # from now on: read at every reconnect (nats-py 2.16)
    made.append(nc)
    return nc


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    namespace: str
    job: str
    max_size: int
    """spec.async.queue.maxSize: trajectories the stream holds at most."""
    when_full: WhenFull = "dropOldest"
    duplicate_window_s: float = 120.0
    """Publishes with an id seen within this window are dropped by the server (a retry, not a sample)."""
    ack_wait_s: float = 600.0
    """How long a pulled, unacked message stays with the trainer before the server redelivers it."""

    @property
    def stream(self) -> str:
        return subjects.stream_name(self.namespace, self.job)

    @property
    def subject(self) -> str:
        return subjects.trajectory_subject(self.namespace, self.job)

    def stream_config(self) -> nats.js.api.StreamConfig:
        return nats.js.api.StreamConfig(
            name=self.stream,
            subjects=[self.subject],
            retention=nats.js.api.RetentionPolicy.WORK_QUEUE,
            max_msgs=self.max_size,
            discard=nats.js.api.DiscardPolicy.OLD
            if self.when_full == "dropOldest"
            else nats.js.api.DiscardPolicy.NEW,
            storage=nats.js.api.StorageType.FILE,
            duplicate_window=self.duplicate_window_s,
        )


async def ensure_stream(js: nats.js.JetStreamContext, settings: StreamSettings) -> None:
    """Create the job's stream, or bring an existing one to these limits."""
    config = settings.stream_config()
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:  # exists with another config (e.g. maxSize changed)
        await js.update_stream(config)


async def _recreate_stream(js: nats.js.JetStreamContext, settings: StreamSettings) -> bool:
    """`ensure_stream` after the bus came back; False (logged) if it does not answer yet."""
    try:
        await ensure_stream(js, settings)
    except (*NO_ANSWER, nats.errors.Error) as exc:
        log.debug("bus: stream %s not (re)created yet: %r", settings.stream, exc)
        return False
    return True


def _is_full(exc: nats.js.errors.APIError) -> bool:
    return exc.err_code == _JS_STREAM_FULL or "maximum messages" in str(exc.description or "")


class WrongStream(RuntimeError):
    """A publish was stored by a stream other than the job's: some other stream captures its subject."""


class Publisher:
    """Publishes trajectories; with whenFull block, waits (backing off) until the stream has room."""

    def __init__(
        self,
        js: nats.js.JetStreamContext,
        settings: StreamSettings,
        metrics: metrics_mod.Bound | None = None,
        max_backoff_s: float = 1.0,
    ) -> None:
        self._js = js
        self._settings = settings
        self._metrics = metrics
        self._max_backoff_s = max_backoff_s
        self.backoffs = 0
        self.blocked_seconds = 0.0
        self.retries = 0
        """Publishes sent again because the bus did not answer."""
        self._unanswered_since: float | None = None

    async def publish(self, traj: trajectory_mod.Trajectory) -> bool:
        """Store one trajectory. False if the server had it already from another publish (the same id
        inside the duplicate window).

        While the bus does not answer (NATS restarting or unreachable) the same message is sent
        again, with the same `Nats-Msg-Id`, until it is stored: counted as retries, logged once per
        outage. An attempt that timed out may still have been stored (nats-py sends what it
        buffered after reconnecting); the server's duplicate window then drops the later copies,
        and a duplicate after our own unanswered attempt is that attempt's store: produced once."""
        data = codec.encode_trajectory(traj)
        delay = 0.01
        unanswered = False
        while True:
            try:
                # No `stream=`: nats-py would send it as a second header (Nats-Expected-Stream) that
                # every consumer fetch parses again; the ack names the stream, checked below instead.
                ack = await self._js.publish(self._settings.subject, data, headers={"Nats-Msg-Id": traj.id})
                break
            except NO_ANSWER as exc:
                unanswered = True
                await self._unanswered(exc)
                continue
            except nats.js.errors.APIError as exc:
                full = _is_full(exc)  # also a 503, with its own error code
                if exc.code == 503 and not full:  # JetStream unavailable: the server is (re)starting
                    unanswered = True
                    await self._unanswered(exc)
                    continue
                if self._settings.when_full != "block" or not full:
                    raise
            self.backoffs += 1
            self.blocked_seconds += delay
            if self._metrics is not None:
                self._metrics.publish_backoffs.inc()
                self._metrics.publish_blocked_seconds.inc(delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_backoff_s)
        if ack.stream != self._settings.stream:
            raise WrongStream(
                f"subject {self._settings.subject}: stored by stream {ack.stream!r}, not the job's stream "
                f"{self._settings.stream!r} (another stream captures this subject)"
            )
        if self._unanswered_since is not None:
            log.warning("bus: answering again after %.1f s", time.monotonic() - self._unanswered_since)
            self._unanswered_since = None
        if ack.duplicate and not unanswered:
            return False
        if self._metrics is not None:
            self._metrics.produced.inc()
        return True

    async def _unanswered(self, exc: Exception) -> None:
        """Count one unanswered publish (logged at the first of an outage) and wait before the next.

        No responders means no stream takes the subject: the server came back without its store (an
        emptyDir NATS pod replaced; what was queued is gone), so the stream is created again."""
        self.retries += 1
        if self._metrics is not None:
            self._metrics.publish_retries.inc()
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()
            log.warning("bus: a publish got no answer (%s); sending again until stored", type(exc).__name__)
        await asyncio.sleep(min(self._max_backoff_s, RECONNECT_WAIT_S))
        if isinstance(exc, nats.errors.NoRespondersError | nats.js.errors.NoStreamResponseError):
            await _recreate_stream(self._js, self._settings)


@dataclasses.dataclass
class Received:
    """One pulled message: the trajectory, or why it could not be decoded; `msg` is acked by the loop."""

    msg: Any
    trajectory: trajectory_mod.Trajectory | None
    error: str | None
    deliveries: int
    stream_seq: int = 0
    """Sequence of the message in the stream (0 if unknown)."""
    stream: str = ""
    """Creation time of the stream it came from (`QueueState.created`): after NATS lost its store the
    stream is created again, and a held message of the old one is told apart by this."""


@dataclasses.dataclass(frozen=True)
class QueueState:
    messages: int
    """In the stream now: not yet delivered, or delivered and not yet acked."""
    first_seq: int
    last_seq: int
    """Sequence of the last stored message = trajectories stored by this stream (it starts at 1)."""
    oldest_age_s: float
    created: str = ""
    """When the stream was created (the server's timestamp): it changes only if the stream is created
    again, which happens when NATS came back without its store."""


def queue_full_drops(state: QueueState, acked_total: int, held_seqs: Iterable[int] = ()) -> int:
    """Trajectories the server discarded (dropOldest) that the trainer never got to train.

    Every stored message (last_seq of them) is in the stream, was acked by the trainer, or was discarded
    by the max_msgs limit; `acked_total` must count every ack the trainer ever sent, across restarts
    (the ledger persists it). A message the trainer holds unacked (`held_seqs`, its stream sequences:
    the batcher's and the client's buffer's, `Consumer.buffered_seqs`) and the server has discarded
    meanwhile (discard old removes from the head: seq < first_seq) is not lost - it will be trained and
    acked - so it is not counted. The caller keeps the highest count seen, so a count must never be too
    high, even for a moment.
    """
    held_discarded = sum(1 for seq in set(held_seqs) if 0 < seq < state.first_seq)
    return max(state.last_seq - state.messages - acked_total - held_discarded, 0)


def delivery(reply: str | None) -> tuple[int, int]:
    """(times delivered, stream sequence) of a pulled message, read from its ack subject.

    The subject is `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ns>.<pending>`,
    or has `<domain>.<account hash>.` after `$JS.ACK.` (and trailing tokens: 11 or more in all).
    nats-py's `msg.metadata` reads the same numbers but also builds datetimes and dataclasses, ~10 us a
    message on the trainer's hot path; tests/unit/test_bus_delivery.py checks that both agree.
    (1, 0) for anything else.
    """
    tokens = (reply or "").split(".")
    if tokens[:2] != ["$JS", "ACK"] or len(tokens) == 10 or len(tokens) < 9:
        return 1, 0
    at = 4 if len(tokens) == 9 else 6
    return int(tokens[at]), int(tokens[at + 1])


def _created(info: nats.js.api.StreamInfo) -> str:
    return info.created.isoformat() if info.created is not None else ""


class Consumer:
    """Trainer-side pull consumer (one per job, durable name `subjects.TRAINER_CONSUMER`)."""

    def __init__(
        self, js: nats.js.JetStreamContext, settings: StreamSettings, max_ack_pending: int = 0
    ) -> None:
        self._js = js
        self._settings = settings
        self._max_ack_pending = max_ack_pending or max(1000, 2 * settings.max_size)
        self._sub: Any = None
        self._reopening: str | None = None
        """Why stream and consumer are being created again, until that has worked."""
        self._reopen_attempts = 0
        self.stream_created = ""
        """Creation time of the stream the consumer was opened on (`QueueState.created`)."""

    async def open(self) -> None:
        """(Re)create the durable consumer and subscribe. The stream's creation time is read first,
        and nothing is replaced unless every call answered: a half-open consumer never tags new
        messages with the old stream (see `Received.stream`)."""
        created = _created(await self._js.stream_info(self._settings.stream))
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self._js.delete_consumer(self._settings.stream, subjects.TRAINER_CONSUMER)
        config = nats.js.api.ConsumerConfig(
            durable_name=subjects.TRAINER_CONSUMER,
            ack_policy=nats.js.api.AckPolicy.EXPLICIT,
            deliver_policy=nats.js.api.DeliverPolicy.ALL,
            ack_wait=self._settings.ack_wait_s,
            max_ack_pending=self._max_ack_pending,
            max_deliver=-1,
        )
        self._sub = await self._js.pull_subscribe(
            self._settings.subject,
            durable=subjects.TRAINER_CONSUMER,
            stream=self._settings.stream,
            config=config,
        )
        self.stream_created = created

    async def fetch(self, max_msgs: int, timeout_s: float) -> list[Received]:
        """Up to `max_msgs` messages; [] if none arrived within `timeout_s`."""
        if self._reopening is not None:  # an earlier attempt did not finish: the subscription is gone
            await self._reopen(self._reopening, timeout_s)
            return []
        try:
            msgs = await self._sub.fetch(max_msgs, timeout=timeout_s)
        except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either, depending on the path
            return []
        except (nats.js.errors.ServiceUnavailableError, nats.js.errors.NotFoundError) as exc:
            await self._reopen(type(exc).__name__, timeout_s)
            return []
        out = []
        for msg in msgs:
            deliveries, seq = delivery(msg.reply)
            try:
                traj = codec.decode_trajectory(msg.data)
                out.append(Received(msg, traj, None, deliveries, seq, self.stream_created))
            except codec.CodecError as exc:
                out.append(Received(msg, None, str(exc), deliveries, seq, self.stream_created))
        return out

    def buffered_seqs(self) -> list[int]:
        """Stream sequences of the messages the server delivered that wait in the client's buffer for
        the next fetch (a pull whose timeout passed before they arrived leaves them there): held, not
        lost. Read from nats-py's pending queue: its public `pending_msgs` only counts, and counts the
        status messages of expired pulls too (their reply is no ack subject: sequence 0, left out)."""
        queue = getattr(getattr(self._sub, "_sub", None), "_pending_queue", None)
        return [seq for msg in list(getattr(queue, "_queue", ())) if (seq := delivery(msg.reply)[1])]

    async def ack(self, received: Received) -> None:
        """Ack a pulled message, unless its stream is gone (NATS came back without its store): an ack
        names stream, consumer and sequence, all three the same in the stream created again, so it
        would remove whichever message there has that sequence."""
        if received.stream == self.stream_created:
            await received.msg.ack()

    async def _reopen(self, why: str, wait_s: float) -> None:
        """The pull found no consumer (503/404): the server came back without its store (an emptyDir
        NATS pod replaced; what was queued is gone) or JetStream is still starting. Stream and
        consumer are created again (opening redelivers what is unacked: the ledger and the batcher
        skip what they have). Until that has worked, every fetch tries again (and returns [])."""
        if self._reopening is None:
            log.warning("bus: the trainer's consumer is gone (%s); creating stream and consumer again", why)
            self._reopening, self._reopen_attempts = why, 0
        self._reopen_attempts += 1
        await asyncio.sleep(min(wait_s, RECONNECT_WAIT_S))
        if not await _recreate_stream(self._js, self._settings):
            return
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None
        try:
            await self.open()
        except (*NO_ANSWER, nats.errors.Error) as err:
            level = logging.WARNING if self._reopen_attempts % 30 == 0 else logging.DEBUG
            log.log(level, "bus: consumer not re-created yet (attempt %d): %r", self._reopen_attempts, err)
            return
        self._reopening = None

    async def state(self) -> QueueState:
        info = await self._js.stream_info(self._settings.stream)
        st = info.state
        age = 0.0
        if st.messages:
            try:
                first = await self._js.get_msg(self._settings.stream, seq=st.first_seq, next=True)
                if first.time is not None:
                    age = max(
                        time.time()
                        - first.time.replace(tzinfo=first.time.tzinfo or datetime.UTC).timestamp(),
                        0.0,
                    )
            except nats.js.errors.NotFoundError:
                pass
        return QueueState(st.messages, st.first_seq, st.last_seq, age, _created(info))

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
