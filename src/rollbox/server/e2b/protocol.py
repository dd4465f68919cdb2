"""The in-sandbox daemon's two RPC services (`process.Process`, `filesystem.Filesystem`), defined here.

E2B's SDK speaks to a daemon inside each sandbox over the Connect protocol. Its messages are declared below
from the protocol's published field names and numbers, and built into protobuf message classes at import, so
that both of Connect's encodings (JSON, which the SDK uses, and binary) come from one definition. The
definitions live in a private descriptor pool: nothing else in the process sees them.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.message import Message

Field = descriptor_pb2.FieldDescriptorProto
SCALARS = {"string": Field.TYPE_STRING, "bytes": Field.TYPE_BYTES, "bool": Field.TYPE_BOOL,
           "uint32": Field.TYPE_UINT32, "sint32": Field.TYPE_SINT32, "int64": Field.TYPE_INT64}


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def field(name: str, number: int, kind: str, *, repeated: bool = False, optional: bool = False,
          oneof: str | None = None) -> dict[str, Any]:
    """One field: `kind` is a scalar's name, `.pkg.Message` for a message or `enum .pkg.Enum` for an enum.
    `optional` is proto3's explicit presence; `oneof` names the oneof it belongs to."""
    return {"name": name, "number": number, "kind": kind, "repeated": repeated, "optional": optional,
            "oneof": oneof}


def string_map(name: str, number: int) -> dict[str, Any]:
    """A `map<string, string>` field (its entry type is made alongside)."""
    return {"name": name, "number": number, "map": True}


def message(name: str, *fields: dict[str, Any], nested: tuple[descriptor_pb2.DescriptorProto, ...] = ()
            ) -> descriptor_pb2.DescriptorProto:
    proto = descriptor_pb2.DescriptorProto(name=name)
    proto.nested_type.extend(nested)
    oneofs: list[str] = [f["oneof"] for f in fields if f.get("oneof")]
    real_oneofs = list(dict.fromkeys(oneofs))
    synthetic = [f"_{f['name']}" for f in fields if f.get("optional")]
    for oneof in real_oneofs + synthetic:  # synthetic oneofs of proto3 `optional` come after the real ones
        proto.oneof_decl.add(name=oneof)
    names = [decl.name for decl in proto.oneof_decl]
    for spec in fields:
        added = proto.field.add(name=spec["name"], number=spec["number"], json_name=_json_name(spec["name"]))
        if spec.get("map"):
            entry = "".join(part.title() for part in spec["name"].split("_")) + "Entry"
            proto.nested_type.add(name=entry, field=[
                Field(name="key", number=1, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL, json_name="key"),
                Field(name="value", number=2, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL, json_name="value"),
            ]).options.map_entry = True
            added.label, added.type, added.type_name = Field.LABEL_REPEATED, Field.TYPE_MESSAGE, entry
            continue
        kind: str = spec["kind"]
        added.label = Field.LABEL_REPEATED if spec["repeated"] else Field.LABEL_OPTIONAL
        if kind in SCALARS:
            added.type = SCALARS[kind]
        elif kind.startswith("enum "):
            added.type, added.type_name = Field.TYPE_ENUM, kind.removeprefix("enum ")
        else:
            added.type, added.type_name = Field.TYPE_MESSAGE, kind
        if spec["oneof"]:
            added.oneof_index = names.index(spec["oneof"])
        if spec["optional"]:
            added.proto3_optional = True
            added.oneof_index = names.index(f"_{spec['name']}")
    return proto


def enum(name: str, *values: tuple[str, int]) -> descriptor_pb2.EnumDescriptorProto:
    return descriptor_pb2.EnumDescriptorProto(
        name=name, value=[descriptor_pb2.EnumValueDescriptorProto(name=n, number=v) for n, v in values])


def _process_file() -> descriptor_pb2.FileDescriptorProto:
    selector = ".process.ProcessSelector"
    return descriptor_pb2.FileDescriptorProto(
        name="process/process.proto", package="process", syntax="proto3",
        enum_type=[enum("Signal", ("SIGNAL_UNSPECIFIED", 0), ("SIGNAL_SIGTERM", 15), ("SIGNAL_SIGKILL", 9))],
        message_type=[
            message("PTY", field("size", 1, ".process.PTY.Size"),
                    nested=(message("Size", field("cols", 1, "uint32"), field("rows", 2, "uint32")),)),
            message("ProcessConfig", field("cmd", 1, "string"), field("args", 2, "string", repeated=True),
                    string_map("envs", 3), field("cwd", 4, "string", optional=True)),
            message("ListRequest"),
            message("ProcessInfo", field("config", 1, ".process.ProcessConfig"), field("pid", 2, "uint32"),
                    field("tag", 3, "string", optional=True)),
            message("ListResponse", field("processes", 1, ".process.ProcessInfo", repeated=True)),
            message("StartRequest", field("process", 1, ".process.ProcessConfig"),
                    field("pty", 2, ".process.PTY", optional=True), field("tag", 3, "string", optional=True),
                    field("stdin", 4, "bool", optional=True)),
            message("UpdateRequest", field("process", 1, selector), field("pty", 2, ".process.PTY", optional=True)),
            message("UpdateResponse"),
            message("ProcessEvent",
                    field("start", 1, ".process.ProcessEvent.StartEvent", oneof="event"),
                    field("data", 2, ".process.ProcessEvent.DataEvent", oneof="event"),
                    field("end", 3, ".process.ProcessEvent.EndEvent", oneof="event"),
                    field("keepalive", 4, ".process.ProcessEvent.KeepAlive", oneof="event"),
                    nested=(
                        message("StartEvent", field("pid", 1, "uint32")),
                        message("DataEvent", field("stdout", 1, "bytes", oneof="output"),
                                field("stderr", 2, "bytes", oneof="output"), field("pty", 3, "bytes", oneof="output")),
                        message("EndEvent", field("exit_code", 1, "sint32"), field("exited", 2, "bool"),
                                field("status", 3, "string"), field("error", 4, "string", optional=True)),
                        message("KeepAlive"),
                    )),
            message("StartResponse", field("event", 1, ".process.ProcessEvent")),
            message("ConnectResponse", field("event", 1, ".process.ProcessEvent")),
            message("SendInputRequest", field("process", 1, selector), field("input", 2, ".process.ProcessInput")),
            message("SendInputResponse"),
            message("ProcessInput", field("stdin", 1, "bytes", oneof="input"), field("pty", 2, "bytes", oneof="input")),
            message("StreamInputRequest",
                    field("start", 1, ".process.StreamInputRequest.StartEvent", oneof="event"),
                    field("data", 2, ".process.StreamInputRequest.DataEvent", oneof="event"),
                    field("keepalive", 3, ".process.StreamInputRequest.KeepAlive", oneof="event"),
                    nested=(message("StartEvent", field("process", 1, selector)),
                            message("DataEvent", field("input", 2, ".process.ProcessInput")),
                            message("KeepAlive"))),
            message("StreamInputResponse"),
            message("SendSignalRequest", field("process", 1, selector), field("signal", 2, "enum .process.Signal")),
            message("SendSignalResponse"),
            message("CloseStdinRequest", field("process", 1, selector)),
            message("CloseStdinResponse"),
            message("ConnectRequest", field("process", 1, selector)),
            message("ProcessSelector", field("pid", 1, "uint32", oneof="selector"),
                    field("tag", 2, "string", oneof="selector")),
        ])


def _filesystem_file() -> descriptor_pb2.FileDescriptorProto:
    entry = ".filesystem.EntryInfo"
    watch = (field("path", 1, "string"), field("recursive", 2, "bool"), field("include_entry", 3, "bool"),
             field("allow_network_mounts", 4, "bool"))
    return descriptor_pb2.FileDescriptorProto(
        name="filesystem/filesystem.proto", package="filesystem", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
        enum_type=[
            enum("FileType", ("FILE_TYPE_UNSPECIFIED", 0), ("FILE_TYPE_FILE", 1), ("FILE_TYPE_DIRECTORY", 2),
                 ("FILE_TYPE_SYMLINK", 3)),
            enum("EventType", ("EVENT_TYPE_UNSPECIFIED", 0), ("EVENT_TYPE_CREATE", 1), ("EVENT_TYPE_WRITE", 2),
                 ("EVENT_TYPE_REMOVE", 3), ("EVENT_TYPE_RENAME", 4), ("EVENT_TYPE_CHMOD", 5)),
        ],
        message_type=[
            message("MoveRequest", field("source", 1, "string"), field("destination", 2, "string")),
            message("MoveResponse", field("entry", 1, entry)),
            message("MakeDirRequest", field("path", 1, "string")),
            message("MakeDirResponse", field("entry", 1, entry)),
            message("RemoveRequest", field("path", 1, "string")),
            message("RemoveResponse"),
            message("StatRequest", field("path", 1, "string")),
            message("StatResponse", field("entry", 1, entry)),
            message("EntryInfo", field("name", 1, "string"), field("type", 2, "enum .filesystem.FileType"),
                    field("path", 3, "string"), field("size", 4, "int64"), field("mode", 5, "uint32"),
                    field("permissions", 6, "string"), field("owner", 7, "string"), field("group", 8, "string"),
                    field("modified_time", 9, ".google.protobuf.Timestamp"),
                    field("symlink_target", 10, "string", optional=True), string_map("metadata", 11),
                    field("is_symlink", 12, "bool")),
            message("ListDirRequest", field("path", 1, "string"), field("depth", 2, "uint32")),
            message("ListDirResponse", field("entries", 1, entry, repeated=True)),
            message("WatchDirRequest", *watch),
            message("FilesystemEvent", field("name", 1, "string"), field("type", 2, "enum .filesystem.EventType"),
                    field("entry", 3, entry, optional=True)),
            message("WatchDirResponse",
                    field("start", 1, ".filesystem.WatchDirResponse.StartEvent", oneof="event"),
                    field("filesystem", 2, ".filesystem.FilesystemEvent", oneof="event"),
                    field("keepalive", 3, ".filesystem.WatchDirResponse.KeepAlive", oneof="event"),
                    nested=(message("StartEvent"), message("KeepAlive"))),
            message("CreateWatcherRequest", *watch),
            message("CreateWatcherResponse", field("watcher_id", 1, "string")),
            message("GetWatcherEventsRequest", field("watcher_id", 1, "string")),
            message("GetWatcherEventsResponse", field("events", 1, ".filesystem.FilesystemEvent", repeated=True)),
            message("RemoveWatcherRequest", field("watcher_id", 1, "string")),
            message("RemoveWatcherResponse"),
        ])


def _build() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    for file in (timestamp, _process_file(), _filesystem_file()):
        pool.Add(file)
    return pool


POOL = _build()


def message_class(full_name: str) -> type[Message]:
    """The class of a message of either service, by its full name (`process.StartRequest`)."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))
