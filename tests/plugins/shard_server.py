"""Python's own http.server serving a folder, as a user would serve shards (`python -m http.server`),
with what the URL-shard tests need of a real server: a rate limit (so that a kill lands in the
middle of a shard), Range requests (`--ranges`; Python's own server ignores them), and a line per
request in a log file (path and Range header), and `sending PATH` / `done PATH` lines as a file's
first bytes go out and as its last have.

    python shard_server.py FOLDER PORT LOG [--rate BYTES_PER_S] [--ranges]
"""

import argparse
import http.server
import os
import re
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("port", type=int)
    parser.add_argument("log")
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--ranges", action="store_true")
    args = parser.parse_args()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=args.folder, **kw)

        def log_message(self, *a):   # the log file says what was asked
            pass

        def do_GET(self):
            path = self.translate_path(self.path)
            with open(args.log, "a") as log:
                log.write(f"{self.path} {self.headers.get('Range', '-')}\n")
            if not os.path.isfile(path):
                return super().do_GET()
            size, start = os.path.getsize(path), 0
            asked = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if asked and args.ranges:
                start = int(asked[1])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(size - start))
            self.end_headers()
            with open(path, "rb") as file:
                file.seek(start)
                sent = 0
                while chunk := file.read(8192):
                    self.wfile.write(chunk)
                    if not sent:   # part of it is the client's now: a kill from here on cuts it mid-file
                        with open(args.log, "a") as log:
                            log.write(f"sending {self.path}\n")
                    sent += len(chunk)
                    if args.rate:
                        time.sleep(len(chunk) / args.rate)
            with open(args.log, "a") as log:
                log.write(f"done {self.path}\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    with open(args.log, "a") as log:
        log.write("listening\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
