"""The connections of `imgtool serve`: one selector loop holds every connection, a small pool computes answers.

A node's connection costs a thread only while its answer is computed (a route, a stat, a manifest read): the
loop accepts, does the TLS handshake, reads the request line, headers and a small body whole, and sends the
answer (its head, then file spans with sendfile, or read, hashed and sent when the blob is checked on the
way), all without blocking. So an idle client, one dripping its headers or one reading a byte a second holds
a descriptor and never a worker, and cannot delay another client. Every wait ends:

- a request (line, headers, small body) must arrive whole within `Limits.request` seconds of its first byte
  (of the accept for a new connection), not per read;
- an answer must move at least `Limits.rate` bytes a second over each `Limits.window` seconds;
- a kept-alive connection waits `Limits.idle` seconds for its next request;
- when `Limits.connections` are open, a new one closes the longest-idle kept-alive connection, else the one
  that has been sending its request longest; connections being answered are never closed for another, and
  while every one is being answered no more are accepted (they wait in the listen backlog).

Deadlines are a heap the loop sleeps on (select's timeout): nothing polls. Workers hand answers back
through a queue and a wake-up socket. Standard library only: it runs from imgtool.pyz on Python 3.7.
"""

import collections
import heapq
import io
import os
import re
import selectors
import socket
import ssl
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

MAX_HEAD = 64 * 1024  # request line and headers; more is refused (431) and the connection closed
MAX_BODY = 64 * 1024  # a body up to this is read with its request (a GET has no use for one); bigger: refused
CHUNK = 256 * 1024  # bytes read, hashed and sent at once when a blob is checked on the way, or over TLS
PIECE = 1024 * 1024  # bytes one sendfile call may send
TURN = 4 * 1024 * 1024  # bytes one connection may send before the loop turns to the others


@dataclass(frozen=True)
class Limits:
    """How long and how slow a client may be, and how many connections are held at once."""

    connections: int = 4096
    request: float = 20.0  # seconds from a request's first byte (a new connection: its accept) to its last
    idle: float = 15.0  # seconds a kept-alive connection waits for its next request
    rate: int = 1024  # bytes a second an answer must move, averaged over each window
    window: float = 60.0


@dataclass
class FileSpan:
    """`length` bytes at `offset` of the file `open()` opens (it raises an error the answer's `done` hears)."""

    open: Callable[[], io.FileIO]
    offset: int
    length: int


@dataclass(frozen=True)
class BytesSpan:
    """Bytes held in memory, sent between file spans (a modelcar layer's tar head and tail around its file); never
    fed to an answer's check, which hashes the files' bytes."""

    data: bytes


@dataclass
class Answer:
    """What to send: `head` (status line, headers, a small body: `head_len` of it is the status line and
    headers), then the spans. With `check`, the spans' bytes are read, fed to it, and the last piece is sent
    only once it matched; else the connection is cut, so a client never receives a whole wrong body (`check`:
    `update(bytes)` with every byte in order, then `finish()` -> (matched, what to say when not)).
    `done(body bytes sent, note)` is called once when the answer went out or was cut."""

    head: bytes
    head_len: int = 0
    spans: Sequence[Union[FileSpan, BytesSpan]] = ()
    check: Optional[Any] = None
    close: bool = False
    done: Optional[Callable[[int, str], None]] = None


# A request, handed to the pool: (client address, its bytes, when it began, whether it is whole). Not whole:
# its head passed MAX_HEAD; the answer refuses it.
Answerer = Callable[[Tuple, bytes, float, bool], Answer]

_HANDSHAKE, _IDLE, _READING, _WORKING, _SENDING, _CLOSED = range(6)


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    addr: Tuple
    state: int
    due: float
    started: float
    buf: bytearray = field(default_factory=bytearray)
    events: int = 0
    answer: Optional[Answer] = None
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    spans: List[Union[FileSpan, BytesSpan]] = field(default_factory=list)
    file: Optional[io.FileIO] = None
    pos: int = 0  # within spans[0]
    scanned: int = 0  # of buf, looked through for the end of the head
    written: int = 0  # of this answer, head included
    window: int = 0  # bytes written in the current window


def head_end(buf, start: int = 0) -> int:
    """Where a request's head ends (after its empty line), -1 while it has not (looked for from `start`);
    http.server's reading: lines end with LF or CRLF, and an empty first line ends it at once."""
    if buf[:1] == b"\n" or buf[:2] == b"\r\n":
        return buf.index(b"\n") + 1
    i = buf.find(b"\n", start)
    while i >= 0:
        if buf[i + 1:i + 2] == b"\n":
            return i + 2
        if buf[i + 1:i + 3] == b"\r\n":
            return i + 3
        i = buf.find(b"\n", i + 1)
    return -1


_NOT_TEXT = re.compile(rb"[^\x20-\x7e\t\r]")


def not_http(buf) -> bool:
    """Whether a request line cannot be one however it goes on: a byte no request line holds (a TLS ClientHello's
    first)."""
    line = buf[:buf.find(b"\n")] if b"\n" in buf else buf
    return bool(_NOT_TEXT.search(line[:MAX_HEAD]))


def body_length(head: bytes) -> int:
    """The bytes of body to read with a request: its Content-Length when there is exactly one value, a number up
    to MAX_BODY; else 0 (no body, or one the answer refuses: the connection is closed after it)."""
    values = set()
    for line in head.split(b"\n")[1:]:
        name, colon, value = line.partition(b":")
        if colon and name.strip().lower() == b"content-length":
            values.add(value.strip())
    if len(values) != 1:
        return 0
    value = values.pop()
    return int(value) if value.isdigit() and len(value) <= 19 and int(value) <= MAX_BODY else 0


class Loop:
    """The selector loop over a listening socket: `run()` until `stop()`; answers computed by `answer` on a pool of
    `workers` threads. `log` hears one line per connection closed for a client's slowness or a failed handshake."""

    def __init__(self, listener: socket.socket, answer: Answerer, *, limits: Limits, workers: int,
                 log: Callable[[str], None], tls: Optional[ssl.SSLContext] = None):
        self.listener, self.answer, self.limits, self.log, self.tls = listener, answer, limits, log, tls
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.listening = True
        self.pool: Optional[ThreadPoolExecutor] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="serve")
        self.conns: Dict[int, _Conn] = {}
        self.idle: "collections.OrderedDict[int, _Conn]" = collections.OrderedDict()  # oldest first
        self.reading: "collections.OrderedDict[int, _Conn]" = collections.OrderedDict()  # longest reading first
        self._heap: List[Tuple[float, int, _Conn]] = []
        self._seq = 0
        self._back: Deque[Tuple[_Conn, Optional[Answer]]] = collections.deque()
        self._stopping = False
        self._ended = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.evicted = 0

    # --- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until stop(); raises what the loop raised (KeyboardInterrupt from a signal handler)."""
        self._thread = threading.current_thread()
        try:
            while not self._stopping:
                for key, mask in self.sel.select(self._timeout()):
                    if key.data == "wake":
                        self._woken()
                    elif key.data == "listen":
                        self._accept()
                    else:
                        self._ready(key.data, mask)
                self._expire()
        finally:
            self._ended.set()

    def request_stop(self) -> None:
        """End run() at its next turn (safe from a signal handler: a flag and a byte to the wake-up socket)."""
        self._stopping = True
        self._wake()

    def stop(self) -> None:
        """End the loop (waiting for it when it runs on another thread), join every worker (an answer being
        computed never waits on a client), cut every connection: the answers being sent or computed hear their
        `done` (cut: the server stopped). Again: nothing to do."""
        if self.pool is None:
            return
        self._stopping = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._ended.wait()
        pool, self.pool = self.pool, None
        pool.shutdown(wait=True)
        while self._back:
            conn, answer = self._back.popleft()
            conn.answer = answer
        for conn in list(self.conns.values()):
            self._close(conn, "connection ended: the server stopped")
        self.sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _timeout(self) -> Optional[float]:
        while self._heap:
            due, _, conn = self._heap[0]
            if conn.state == _CLOSED or conn.due != due:
                heapq.heappop(self._heap)  # stale: the connection moved on since
                continue
            return max(due - time.monotonic(), 0.0)
        return None

    def _at(self, conn: _Conn, due: float) -> None:
        conn.due = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, conn))

    def _want(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if not events:
            self.sel.unregister(conn.sock)
        elif not conn.events:
            self.sel.register(conn.sock, events, conn)
        else:
            self.sel.modify(conn.sock, events, conn)
        conn.events = events

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full: a wake-up is pending anyway; closed: stopping
            pass

    def _woken(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._back:
            conn, answer = self._back.popleft()
            if answer is None:
                self._close(conn, "")
            else:
                self._start(conn, answer)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            due, _, conn = heapq.heappop(self._heap)
            if conn.state == _CLOSED or conn.due != due:
                continue
            if conn.state == _IDLE:
                self._close(conn, "")  # a kept-alive connection's client went quiet: nothing to say
            elif conn.state in (_HANDSHAKE, _READING):
                self.log(f"{conn.addr[0]} - request timed out: {len(conn.buf)} bytes of a request in "
                         f"{now - conn.started:.0f} s (the request line and headers must come within "
                         f"{self.limits.request:g} s); closed")
                self._close(conn, "")
            elif conn.state == _SENDING:
                floor = self.limits.rate * self.limits.window
                if conn.window < floor:
                    self._close(conn, f"connection ended: the client took {conn.window} bytes in "
                                      f"{self.limits.window:g} s (at least {self.limits.rate} a second); cut")
                else:
                    conn.window = 0
                    self._at(conn, now + self.limits.window)

    # --- accepting and reading ------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors (EMFILE, ENFILE): close one held for nothing, else wait
                if not self._evict():
                    self.log(f"serve: cannot accept a connection: {e.strerror or e}; new ones wait until one closes")
                    self._listen(False)
                    return
                continue
            if len(self.conns) >= self.limits.connections and not self._evict():
                self._listen(False)  # every connection is being answered: this one is held, the next wait
            sock.setblocking(False)
            # headers and a small body in one write, blobs in full segments: Nagle's wait helps nothing here
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.monotonic()
            state = _READING
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError) as e:
                    self.log(f"{addr[0]} - connection ended: {type(e).__name__}: {e}")
                    sock.close()
                    continue
                state = _HANDSHAKE
            conn = _Conn(sock, addr, state, 0.0, now)
            self.conns[sock.fileno()] = conn
            self.reading[sock.fileno()] = conn
            self._at(conn, now + self.limits.request)
            self._want(conn, selectors.EVENT_READ)
            if not self.listening:
                return

    def _listen(self, on: bool) -> None:
        if on != self.listening:
            if on:
                self.sel.register(self.listener, selectors.EVENT_READ, "listen")
            else:
                self.sel.unregister(self.listener)
            self.listening = on

    def _evict(self) -> bool:
        """Close a connection held for nothing (the longest-idle kept-alive one, else the longest reading its
        request) to make room; False when every one is being answered."""
        if self.idle:
            self._close(next(iter(self.idle.values())), "")
        elif self.reading:
            conn = next(iter(self.reading.values()))
            self.log(f"{conn.addr[0]} - closed to make room for a new connection ({self.limits.connections} are open): "
                     f"it had sent {len(conn.buf)} bytes of a request in {time.monotonic() - conn.started:.1f} s")
            self._close(conn, "")
        else:
            return False
        self.evicted += 1
        return True

    def _ready(self, conn: _Conn, mask: int) -> None:
        if conn.state == _HANDSHAKE:
            self._handshake(conn)
        elif conn.state in (_IDLE, _READING):
            self._read(conn)
        elif conn.state == _SENDING:
            self._send(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return self._want(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            return self._want(conn, selectors.EVENT_WRITE)
        except (OSError, ValueError) as e:  # SSLError is an OSError
            self.log(f"{conn.addr[0]} - connection ended: {type(e).__name__}: {e}")
            return self._close(conn, "")
        conn.state = _READING
        self._want(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        try:
            data = sock.recv(65536)
            while data and isinstance(sock, ssl.SSLSocket) and sock.pending() and len(data) < MAX_HEAD + MAX_BODY:
                data += sock.recv(65536)  # decrypted already: the selector would not say so
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return
        except ssl.SSLWantWriteError:
            return self._want(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
        except (OSError, ValueError):  # reset, or a TLS error: nothing to answer
            return self._close(conn, "")
        if not data:  # the client closed it (a kept-alive connection's usual end)
            return self._close(conn, "")
        if conn.state == _IDLE:
            self._reading(conn)
        conn.buf += data
        self._want(conn, selectors.EVENT_READ)
        self._request(conn)

    def _reading(self, conn: _Conn) -> None:
        """A kept-alive connection's next request began: its deadline runs from now."""
        conn.state = _READING
        conn.started = time.monotonic()
        conn.scanned = 0
        self.idle.pop(conn.sock.fileno(), None)
        self.reading[conn.sock.fileno()] = conn
        self._at(conn, conn.started + self.limits.request)

    def _request(self, conn: _Conn) -> None:
        """Hand a whole request to the pool (one at a time per connection: what follows waits in the buffer)."""
        end = head_end(conn.buf, conn.scanned)
        if end < 0 and not_http(conn.buf):
            # answered now (400, closed), not at the deadline: a client trying TLS on a plain port (skopeo, Go with
            # tls-verify=false) falls back to HTTP on that answer, and would wait 10 s for a ServerHello without it
            data, whole = bytes(conn.buf[:MAX_HEAD]), True
            conn.buf.clear()
        elif end < 0:
            conn.scanned = max(len(conn.buf) - 3, 0)  # a dripping client's head is scanned once, not once per byte
            if len(conn.buf) <= MAX_HEAD:
                return
            data, whole = bytes(conn.buf[:MAX_HEAD]), False
            conn.buf.clear()
        else:
            need = end + body_length(bytes(conn.buf[:end]))
            if len(conn.buf) < need:
                return
            data, whole = bytes(conn.buf[:need]), True
            del conn.buf[:need]
            conn.scanned = 0
        conn.state = _WORKING
        self.reading.pop(conn.sock.fileno(), None)
        self._want(conn, 0)
        assert self.pool is not None
        self.pool.submit(self._work, conn, data, whole)

    def _work(self, conn: _Conn, data: bytes, whole: bool) -> None:
        """On a worker: the answer, handed back to the loop."""
        answer = None
        try:
            answer = self.answer(conn.addr, data, conn.started, whole)
        # A bug in one answer: one line, and the server goes on with the other connections (as socketserver's
        # handle_error; a traceback is not worth a dead registry under a whole cluster).
        except Exception as e:
            self.log(f"{conn.addr[0]} - connection ended: {type(e).__name__}: {e}")
        finally:
            self._back.append((conn, answer))
            self._wake()

    # --- sending ---------------------------------------------------------------------------------

    def _start(self, conn: _Conn, answer: Answer) -> None:
        conn.state, conn.answer = _SENDING, answer
        conn.out, conn.spans, conn.pos, conn.written, conn.window = memoryview(answer.head), list(answer.spans), 0, 0, 0
        self._at(conn, time.monotonic() + self.limits.window)
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        answer = conn.answer
        assert answer is not None
        budget = TURN
        try:
            while budget > 0:
                if conn.out:
                    n = conn.sock.send(conn.out)
                    conn.out = conn.out[n:]
                elif conn.spans:
                    n = self._send_span(conn)
                    if n < 0:
                        continue  # a piece read (and checked) into conn.out, or the next span
                else:
                    return self._sent(conn)
                conn.written += n
                conn.window += n
                budget -= n
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
            pass
        except ssl.SSLWantReadError:
            return self._want(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
        except _Cut as e:
            return self._close(conn, str(e))
        except (OSError, ValueError) as e:
            return self._close(conn, f"connection ended: {type(e).__name__}")
        self._want(conn, selectors.EVENT_WRITE)

    def _send_span(self, conn: _Conn) -> int:
        """Send from the current span with sendfile (bytes sent), or read its next piece into conn.out, checking it
        on the way (-1); -1 too when the span is done. Raises _Cut (the file ended early, the check failed)."""
        span = conn.spans[0]
        if isinstance(span, BytesSpan):
            conn.spans.pop(0)
            conn.out = memoryview(span.data)
            return -1
        if conn.file is None:
            try:
                conn.file = span.open()
            except Exception as e:  # BlobDamaged (a part missing, unreadable) and its like: cut, said
                raise _Cut(f"connection ended: {getattr(e, 'message', None) or e}") from None
        left = span.length - conn.pos
        if left == 0:
            conn.file.close()
            conn.file = None
            conn.spans.pop(0)
            conn.pos = 0
            return -1
        check = conn.answer.check if conn.answer else None
        if check is None and not isinstance(conn.sock, ssl.SSLSocket):
            # at most a piece per call: however fast a client reads, one call never holds the loop for long
            n = os.sendfile(conn.sock.fileno(), conn.file.fileno(), span.offset + conn.pos, min(left, PIECE))
            if n == 0:
                raise _Cut("connection ended: a part file shrank while it was sent")
            conn.pos += n
            return n
        data = os.pread(conn.file.fileno(), min(left, CHUNK), span.offset + conn.pos)
        if not data:
            raise _Cut("connection ended: a part file shrank while it was sent")
        conn.pos += len(data)
        if check is not None:
            check.update(data)
            if conn.pos == span.length and not any(isinstance(s, FileSpan) for s in conn.spans[1:]):
                # the file's last piece: it goes out only if all matched
                ok, why = check.finish()
                if not ok:
                    raise _Cut(why)
        conn.out = memoryview(data)
        return -1

    def _sent(self, conn: _Conn) -> None:
        answer = conn.answer
        assert answer is not None
        conn.answer = None
        if answer.done is not None:
            answer.done(max(conn.written - answer.head_len, 0), "")
        if answer.close:
            return self._close(conn, "")
        conn.state = _IDLE
        self.idle[conn.sock.fileno()] = conn
        self._at(conn, time.monotonic() + self.limits.idle)
        self._want(conn, selectors.EVENT_READ)
        if conn.buf:  # a request that came behind this one
            self._reading(conn)
            self._request(conn)

    def _close(self, conn: _Conn, note: str) -> None:
        """Close a connection; an answer it was sending hears `done` with the note (why it was cut)."""
        if conn.state == _CLOSED:
            return
        answer, conn.answer = conn.answer, None
        if answer is not None:
            if answer.done is not None:
                answer.done(max(conn.written - answer.head_len, 0), note or "connection ended")
            try:  # cut mid-answer: reset, so the kernel drops what a stalled client left unread at once
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        if conn.file is not None:
            conn.file.close()
            conn.file = None
        fd = conn.sock.fileno()
        if conn.events:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        conn.state = _CLOSED
        self.conns.pop(fd, None)
        self.idle.pop(fd, None)
        self.reading.pop(fd, None)
        try:
            conn.sock.close()
        except OSError:
            pass
        if not self.listening and not self._stopping and len(self.conns) < self.limits.connections:
            self._listen(True)


class _Cut(Exception):
    """An answer cut short: the note its `done` hears."""
