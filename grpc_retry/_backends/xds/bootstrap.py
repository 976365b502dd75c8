"""The xDS bootstrap, read as gRPC's core reads it (gRFC A27; authorities and xdstp names, gRFC A47): where it
comes from (GRPC_XDS_BOOTSTRAP, a file, else GRPC_XDS_BOOTSTRAP_CONFIG, the JSON), what it must hold, and the
listener resource an `xds:` target asks for. What the core rejects is rejected here, every problem listed with its
field; what the core ignores (unknown fields, unknown server features) is ignored."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple
from urllib.parse import quote

from grpc_retry._json import JsonReader, cut, decode, listing, show

BOOTSTRAP_FILE = "GRPC_XDS_BOOTSTRAP"
BOOTSTRAP_CONFIG = "GRPC_XDS_BOOTSTRAP_CONFIG"
FEDERATION = "GRPC_EXPERIMENTAL_XDS_FEDERATION"  # gRPC's switch for authorities (on unless set otherwise)

CHANNEL_CREDS = ("google_default", "insecure", "fake", "tls")  # the types gRPC's core knows
SERVER_FEATURES = ("ignore_resource_deletion", "fail_on_data_errors", "resource_timer_is_transient_error",
                   "trusted_xds_server")
CERTIFICATE_PLUGINS = ("file_watcher",)
MAX_DEPTH = 255  # gRPC's JSON reader refuses deeper nesting
_TRUE = ("1", "t", "true", "y", "yes")
_PATH_SAFE = "/:@!$&'()*+,;="  # besides letters, digits and "-._~": what a URI path keeps as it is (RFC 3986)


class BootstrapError(ValueError):
    """An xDS bootstrap that cannot be used; `errors` lists every problem as "field: reason"."""

    errors: List[str]

    def __init__(self, source: str, errors: List[str]) -> None:
        self.errors = list(errors)
        super().__init__(f"invalid xDS bootstrap ({source}): {listing(self.errors)}")


@dataclass(frozen=True)
class XdsServer:
    """A management server: its URI, the channel credentials it is reached with (the first type gRPC knows of
    those listed, and its config) and the features the bootstrap grants it."""

    server_uri: str
    channel_creds: str
    channel_creds_config: Mapping[str, Any] = field(default_factory=dict)
    features: FrozenSet[str] = frozenset()

    @property
    def ignore_resource_deletion(self) -> bool:
        return "ignore_resource_deletion" in self.features


@dataclass(frozen=True)
class Locality:
    region: str = ""
    zone: str = ""
    sub_zone: str = ""


@dataclass(frozen=True)
class Node:
    """What the client says of itself to the management server."""

    id: str = ""
    cluster: str = ""
    locality: Locality = Locality()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Authority:
    """An authority of xdstp names: its listener name template ("": the default) and its servers (none: the
    bootstrap's own)."""

    name: str
    client_listener_resource_name_template: str = ""
    xds_servers: Tuple[XdsServer, ...] = ()
    fallback_on_reachability_only: bool = False


@dataclass(frozen=True)
class Bootstrap:
    xds_servers: Tuple[XdsServer, ...]
    node: Node = Node()
    authorities: Mapping[str, Authority] = field(default_factory=dict)
    client_default_listener_resource_name_template: str = ""
    server_listener_resource_name_template: str = ""
    certificate_providers: Mapping[str, Tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    source: str = ""

    def servers(self, authority: Optional[str]) -> Tuple[XdsServer, ...]:
        """The servers that hold the resources of `authority` (None: the old-style names)."""
        if authority is None or authority not in self.authorities:
            return self.xds_servers
        return self.authorities[authority].xds_servers or self.xds_servers

    def listener_name(self, authority: str, name: str) -> str:
        """The listener resource the target xds://authority/name asks for (authority "": xds:///name), as gRPC's
        resolver names it; ValueError for an authority the bootstrap does not list."""
        if not authority:
            template = self.client_default_listener_resource_name_template or "%s"
        elif authority in self.authorities:
            template = (self.authorities[authority].client_listener_resource_name_template
                        or f"xdstp://{authority}/envoy.config.listener.v3.Listener/%s")
        else:
            raise ValueError(f"the xDS bootstrap ({self.source}) has no authority {authority!r} "
                             f"(known: {sorted(self.authorities) or 'none'})")
        if template.startswith("xdstp:"):
            name = quote(name, safe=_PATH_SAFE)
        return template.replace("%s", name)


def load(environ: Optional[Mapping[str, str]] = None) -> Bootstrap:
    """The bootstrap the environment names, as grpcio finds it: GRPC_XDS_BOOTSTRAP's file whenever that variable
    is set (even empty), else GRPC_XDS_BOOTSTRAP_CONFIG's JSON. Raises BootstrapError."""
    env = os.environ if environ is None else environ
    federation = env.get(FEDERATION, "true").strip().lower() in _TRUE
    path = env.get(BOOTSTRAP_FILE)
    if path is not None:
        source = f"{BOOTSTRAP_FILE}={path}"
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as error:
            raise BootstrapError(source, [f"<file>: cannot be read: {error}"]) from None
        return parse(text, source, federation=federation)
    config = env.get(BOOTSTRAP_CONFIG)
    if config is not None:
        return parse(config, BOOTSTRAP_CONFIG, federation=federation)
    raise BootstrapError("environment", [f"neither {BOOTSTRAP_FILE} (a file) nor {BOOTSTRAP_CONFIG} (the JSON) is "
                                         "set: an xds: target needs one"])


def parse(text: str, source: str = "<text>", *, federation: bool = True) -> Bootstrap:
    """A bootstrap from its JSON text; BootstrapError lists every problem. `federation`: read `authorities` and
    `client_default_listener_resource_name_template` (gRPC's GRPC_EXPERIMENTAL_XDS_FEDERATION)."""
    try:
        doc = decode(text)
    except RecursionError:
        raise BootstrapError(source, ["<root>: invalid JSON: nested too deeply"]) from None
    except (ValueError, TypeError) as error:
        raise BootstrapError(source, [f"<root>: invalid JSON: {cut(str(error))}"]) from None
    reader = _Reader()
    reader.duplicates(doc)  # (gRPC's JSON reader refuses a key given twice)
    if _depth(doc) > MAX_DEPTH:
        reader.error("<root>", f"invalid JSON: nested deeper than {MAX_DEPTH}")
    bootstrap = reader.bootstrap(doc, source, federation)
    if reader.errors or bootstrap is None:
        raise BootstrapError(source, reader.errors)
    return bootstrap


class _Reader(JsonReader):
    """Walks the decoded bootstrap: each method returns what it read, or None after recording the errors."""

    def bootstrap(self, doc: Any, source: str, federation: bool) -> Optional[Bootstrap]:
        root = self.json_object(doc, "<root>")
        if root is None:
            return None
        servers = self.servers(root, "", required=True)
        node = self.node(root)
        providers = self.certificate_providers(root)
        server_template = self.get(root, "", "server_listener_resource_name_template", self.json_string) or ""
        authorities: Dict[str, Authority] = {}
        client_template = ""
        if federation:  # (else gRPC does not read them at all, however malformed)
            client_template = self.get(root, "", "client_default_listener_resource_name_template",
                                       self.json_string) or ""
            authorities = self.authorities(root)
        if servers is None:
            return None
        return Bootstrap(servers, node, authorities, client_template, server_template, providers, source)

    def servers(self, obj: Dict[str, Any], path: str, required: bool) -> Optional[Tuple[XdsServer, ...]]:
        where = f"{path}.xds_servers" if path else "xds_servers"
        before = len(self.errors)
        listed = self.get(obj, path, "xds_servers", self.json_list, required=required)
        if listed is None:
            return None if required else ()
        servers = [self.server(item, f"{where}[{i}]") for i, item in enumerate(listed)]
        if required and not listed and len(self.errors) == before:
            self.error(where, "must be non-empty")
        return tuple(s for s in servers if s is not None)

    def server(self, value: Any, path: str) -> Optional[XdsServer]:
        obj = self.json_object(value, path)
        if obj is None:
            return None
        uri = self.get(obj, path, "server_uri", self.json_string, required=True)
        creds = self.channel_creds(obj, path)
        features = self.server_features(obj, path)
        if uri is None or creds is None:
            return None
        return XdsServer(uri, creds[0], creds[1], features)

    def channel_creds(self, obj: Dict[str, Any], path: str) -> Optional[Tuple[str, Dict[str, Any]]]:
        """The first type gRPC knows, and its config; every entry is checked."""
        listed = self.get(obj, path, "channel_creds", self.json_list, required=True)
        if listed is None:
            return None
        before = len(self.errors)
        chosen: Optional[Tuple[str, Dict[str, Any]]] = None
        for i, item in enumerate(listed):
            where = f"{path}.channel_creds[{i}]"
            entry = self.json_object(item, where)
            if entry is None:
                continue
            kind = self.get(entry, where, "type", self.json_string, required=True)
            config = self.get(entry, where, "config", self.json_object) or {}
            if kind not in CHANNEL_CREDS:
                continue
            if kind == "tls":
                self.tls_config(config, f"{where}.config")
            if chosen is None:
                chosen = (kind, _plain(config))
        if chosen is None and len(self.errors) == before:
            self.error(f"{path}.channel_creds", f"no known type (gRPC knows {', '.join(CHANNEL_CREDS)})")
        return chosen if len(self.errors) == before else None

    def tls_config(self, config: Dict[str, Any], path: str) -> None:
        files = {key: self.get(config, path, key, self.json_string)
                 for key in ("certificate_file", "private_key_file", "ca_certificate_file")}
        self.get(config, path, "refresh_interval", self.duration)
        if (files["certificate_file"] is None) != (files["private_key_file"] is None):
            self.error(path, '"certificate_file" and "private_key_file" must be both set or both unset')

    def server_features(self, obj: Dict[str, Any], path: str) -> FrozenSet[str]:
        if "server_features" in obj and obj["server_features"] is None:
            self.error(f"{path}.server_features", "must be a list")  # (gRPC reads this one by hand: null is wrong)
            return frozenset()
        listed = self.get(obj, path, "server_features", self.json_list) or []
        return frozenset(item for item in listed if item in SERVER_FEATURES)  # (others ignored, as gRPC does)

    def node(self, root: Dict[str, Any]) -> Node:
        obj = self.get(root, "", "node", self.json_object)
        if obj is None:
            return Node()
        strings = {key: self.get(obj, "node", key, self.json_string) or "" for key in ("id", "cluster")}
        locality = Locality()
        place = self.get(obj, "node", "locality", self.json_object)
        if place is not None:
            locality = Locality(*(self.get(place, "node.locality", key, self.json_string) or ""
                                  for key in ("region", "zone", "sub_zone")))
        metadata = self.get(obj, "node", "metadata", self.json_object) or {}
        return Node(strings["id"], strings["cluster"], locality, _plain(metadata))

    def certificate_providers(self, root: Dict[str, Any]) -> Dict[str, Tuple[str, Mapping[str, Any]]]:
        obj = self.get(root, "", "certificate_providers", self.json_object) or {}
        providers: Dict[str, Tuple[str, Mapping[str, Any]]] = {}
        for name, value in obj.items():
            path = f"certificate_providers[{show(name)}]"
            entry = self.json_object(value, path)
            if entry is None:
                continue
            plugin = self.get(entry, path, "plugin_name", self.json_string, required=True)
            if "config" in entry and entry["config"] is None:
                self.error(f"{path}.config", "must be an object")
                continue
            config = self.get(entry, path, "config", self.json_object) or {}
            if plugin is None:
                continue
            if plugin and plugin not in CERTIFICATE_PLUGINS:
                self.error(f"{path}.plugin_name", f"unknown plugin {show(plugin)} (gRPC knows "
                                                   f"{', '.join(CERTIFICATE_PLUGINS)})")
                continue
            if plugin == "file_watcher":
                self.file_watcher(config, f"{path}.config")
            providers[name] = (plugin, _plain(config))
        return providers

    def file_watcher(self, config: Dict[str, Any], path: str) -> None:
        files = {key: self.get(config, path, key, self.json_string)
                 for key in ("certificate_file", "private_key_file", "ca_certificate_file", "spiffe_bundle_map_file")}
        self.get(config, path, "refresh_interval", self.duration)
        if (files["certificate_file"] is None) != (files["private_key_file"] is None):
            self.error(path, '"certificate_file" and "private_key_file" must be both set or both unset')
        if files["certificate_file"] is None and files["ca_certificate_file"] is None:
            self.error(path, 'at least one of "certificate_file" and "ca_certificate_file" must be set')

    def authorities(self, root: Dict[str, Any]) -> Dict[str, Authority]:
        obj = self.get(root, "", "authorities", self.json_object) or {}
        authorities: Dict[str, Authority] = {}
        for name, value in obj.items():
            path = f"authorities[{show(name)}]"
            entry = self.json_object(value, path)
            if entry is None:
                continue
            template = self.get(entry, path, "client_listener_resource_name_template", self.json_string) or ""
            if template and not template.startswith(f"xdstp://{name}/"):
                self.error(f"{path}.client_listener_resource_name_template",
                           f"must begin with {show(f'xdstp://{name}/')}")
            servers = self.servers(entry, path, required=False) or ()
            fallback = self.get(entry, path, "fallback_on_reachability_only", self.json_bool) or False
            authorities[name] = Authority(name, template, servers, fallback)
        return authorities


def _depth(doc: Any) -> int:
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
    return deepest


def _plain(value: Any) -> Any:
    """Decoded JSON as plain Python: dicts, lists, and numbers as int or float."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, Decimal):
        return float(value)
    return value
