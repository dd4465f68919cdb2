"""A server for inside a sandbox, on the standard library alone (sandboxes have no packages): HTTP/1.1 with
keep-alive, a streamed answer, and a WebSocket echo. Tests write it into a sandbox and start it in the background:

    sandbox.files.write("/tmp/port_server.py", PORT_SERVER)
    sandbox.commands.run("python3 /tmp/port_server.py 8000", background=True)

- `GET /hello` answers `hello from <hostname>` (and the request's headers as JSON at `/headers`);
- `POST /echo` answers the body it was sent;
- `GET /stream?n=3` answers n lines, 0.2 s apart, as they are made (chunked);
- `GET /ws` is a WebSocket that echoes every message (text as text, binary as binary).
"""

from __future__ import annotations

PORT_SERVER = r'''
import asyncio, base64, hashlib, json, socket, struct, sys
from urllib.parse import parse_qs, urlsplit

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return method, target, headers


async def read_body(reader, headers):
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return await reader.readexactly(int(headers.get("content-length", "0")))
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        body += await reader.readexactly(size + 2)
        if size == 0:
            return body[:-2]
        body = body[:-2]


async def respond(writer, status, body, content_type="text/plain"):
    writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
                 .encode() + body)
    await writer.drain()


async def websocket(reader, writer, headers):
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
    protocol = headers.get("sec-websocket-protocol", "").split(",")[0].strip()
    extra = f"sec-websocket-protocol: {protocol}\r\n" if protocol else ""
    writer.write(f"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
                 f"sec-websocket-accept: {accept}\r\n{extra}\r\n".encode())
    await writer.drain()
    while True:
        first, second = await reader.readexactly(2)
        opcode, length = first & 0x0F, second & 0x7F
        if length == 126:
            (length,) = struct.unpack(">H", await reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack(">Q", await reader.readexactly(8))
        mask = await reader.readexactly(4) if second & 0x80 else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(await reader.readexactly(length)))
        if opcode == 8:
            writer.write(b"\x88" + bytes([len(payload)]) + payload)
            await writer.drain()
            return
        if opcode == 9:
            opcode = 10
        size = len(payload)
        header = bytes([0x80 | opcode]) + (bytes([size]) if size < 126 else
                                           b"\x7e" + struct.pack(">H", size) if size < 65536 else
                                           b"\x7f" + struct.pack(">Q", size))
        writer.write(header + payload)
        await writer.drain()


async def serve(reader, writer):
    try:
        while True:
            method, target, headers = await read_head(reader)
            url = urlsplit(target)
            body = await read_body(reader, headers)
            if url.path == "/ws" and headers.get("upgrade", "").lower() == "websocket":
                await websocket(reader, writer, headers)
                return
            if url.path == "/hello":
                await respond(writer, "200 OK", f"hello from {socket.gethostname()}".encode())
            elif url.path == "/headers":
                await respond(writer, "200 OK", json.dumps({"target": target, "headers": headers}).encode(),
                              "application/json")
            elif url.path == "/echo":
                await respond(writer, "200 OK", body, headers.get("content-type", "application/octet-stream"))
            elif url.path == "/stream":
                count = int(parse_qs(url.query).get("n", ["3"])[0])
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                for index in range(count):
                    line = f"data: {index}\n\n".encode()
                    writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.2)
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            else:
                await respond(writer, "404 Not Found", b"no such page")
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(serve, "0.0.0.0", int(sys.argv[1]), backlog=1024)
    async with server:
        await server.serve_forever()


asyncio.run(main())
'''


def start_port_server(sandbox: object, port: int, path: str = "/tmp/port_server.py") -> None:
    """Writes the server into `sandbox` (rollbox's SDK `Sandbox`) and starts it in the background on `port`."""
    sandbox.files.write(path, PORT_SERVER)  # type: ignore[attr-defined]
    sandbox.commands.run(f"python3 {path} {port}", background=True)  # type: ignore[attr-defined]
