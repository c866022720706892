#!/usr/bin/env python3
"""A fake ``trtllm-serve``: an OpenAI-compatible completions server (stdlib only), for the serving
tests that need no real engine (TensorRT-LLM's mapping; the fault paths).

It takes ``trtllm-serve``'s arguments (TensorRT-LLM 1.x: ``MODEL --host --port --backend --tp_size
--pp_size --max_batch_size --max_seq_len --served_model_name``; an unknown one is an error, as in
the real CLI), and serves what the serving client uses: ``/health``, ``/v1/models``,
``/v1/completions`` (streamed as server-sent events with a final usage chunk, or unstreamed) and
``/metrics`` (TensorRT-LLM's is JSON iteration statistics, so a list here). Each request
"generates" ``max_tokens`` deterministic token ids, one every ``FAKE_SERVE_TOKEN_S`` seconds,
running at most ``max_batch_size`` at once (the rest wait).

Faults, from ``FAKE_SERVE_FAULTS`` (test-only): a JSON object keyed by layout (``tp1pp1``, ...),
so that one sweep gives each layout's job its own fault:
- ``{"fail_start": "<message>"}``: print the message (an out-of-memory traceback, say) and exit 1
  before listening;
- ``{"die_after": n}``: SIGKILL itself when the n-th completion request arrives.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trtllm-serve")
    p.add_argument("model")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", choices=["pytorch", "tensorrt", "_autodeploy"], default="pytorch")
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--max_batch_size", type=int, default=8)
    p.add_argument("--max_seq_len", type=int)
    p.add_argument("--served_model_name")
    return p.parse_args(argv)


def fault(args) -> dict:
    faults = json.loads(os.environ.get("FAKE_SERVE_FAULTS") or "{}")
    return faults.get(f"tp{args.tp_size}pp{args.pp_size}", {})


def tokens(prompt: list[int], n: int) -> list[int]:
    last = prompt[-1] if prompt else 0
    return [(last + k + 1) % 500 for k in range(n)]


class State:
    def __init__(self, args):
        self.name = args.served_model_name or args.model
        self.slots = threading.Semaphore(args.max_batch_size)
        self.token_s = float(os.environ.get("FAKE_SERVE_TOKEN_S", "0.002"))
        self.die_after = int(fault(args).get("die_after", 0))
        self.count = 0
        self.lock = threading.Lock()
        self.running = 0


def handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet, like --disable-uvicorn-access-log
            pass

        def _json(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._json(200, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": state.name}]})
            elif self.path == "/metrics":
                self._json(200, [{"numActiveRequests": state.running}])
            else:
                self._json(404, {"error": self.path})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            req = json.loads(self.rfile.read(length) or b"{}")
            with state.lock:
                state.count += 1
                if state.die_after and state.count >= state.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            prompt = req.get("prompt") or []
            n = int(req.get("max_tokens") or 16)
            out = tokens(prompt, n)
            with state.slots:
                state.running += 1
                try:
                    if req.get("stream"):
                        self._stream(out, len(prompt))
                    else:
                        time.sleep(state.token_s * n)
                        self._json(200, {"choices": [{"text": "x" * n, "index": 0}],
                                         "usage": {"prompt_tokens": len(prompt),
                                                   "completion_tokens": n}})  # fmt: skip
                finally:
                    state.running -= 1

        def _stream(self, out: list[int], prompt_len: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data: str) -> None:
                raw = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                self.wfile.flush()

            for t in out:
                time.sleep(state.token_s)
                chunk(json.dumps({"choices": [{"text": f"t{t} ", "index": 0}]}))
            usage = {"prompt_tokens": prompt_len, "completion_tokens": len(out)}
            chunk(json.dumps({"choices": [], "usage": usage}))
            chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if "fail_start" in fault(args):
        print(fault(args)["fail_start"], file=sys.stderr, flush=True)
        return 1
    print(f"fake trtllm-serve: {args.model} on {args.host}:{args.port}", flush=True)
    server = ThreadingHTTPServer((args.host, args.port), handler(State(args)))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    print("fake trtllm-serve: shut down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
