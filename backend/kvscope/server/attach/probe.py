"""Is there a vLLM server at this URL, and what does it serve? One clear sentence when not."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from packaging.version import InvalidVersion, Version

from kvscope.server.attach.metrics import parse

PROBE_TIMEOUT_S = 5.0
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "F32": 4, "F16": 2, "BF16": 2}


class AttachError(Exception):
    """The attach target is unusable; the message is the one line the user sees."""


@dataclass
class KVEventSource:
    endpoint: str            # where kvscope's subscriber goes
    bind: bool               # True when vLLM connects out to it, so kvscope must bind it
    replay_endpoint: str | None
    topic: str


@dataclass
class VllmServer:
    url: str
    version: str
    model: str
    max_model_len: int
    block_size: int
    num_blocks: int
    enable_prefix_caching: bool
    kv_cache_bytes: int
    kv_events: list[KVEventSource]                            # one per data-parallel rank; [] without KV events
    scheduler: dict[str, int] = field(default_factory=dict)   # from /server_info, when vLLM shows it
    device: str | None = None                                 # "cuda", "cpu", ... (ditto)

    @property
    def data_parallel_size(self) -> int:
        return max(1, len(self.kv_events))

    @property
    def supports_full_kv_report(self) -> bool:
        """vLLM 0.32's kv_cache_report_mode "full": BlockStored also names the prefix blocks a request reused."""
        return version_tuple(self.version) >= (0, 32)


def normalized_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AttachError(f"--attach wants the vLLM server's base URL, such as http://127.0.0.1:8000 (got {url!r})")
    return url.rstrip("/").removesuffix("/v1")


def probe(url: str, kv_events: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> VllmServer:
    url = normalized_url(url)
    with httpx.Client(base_url=url, timeout=timeout) as http:
        version = _json(http, "/version", url).get("version")
        if not isinstance(version, str):
            raise AttachError(f"{url} is not a vLLM server: its /version has no version")
        models = _json(http, "/v1/models", url).get("data") or []
        if not models:
            raise AttachError(f"the vLLM server at {url} lists no model at /v1/models")
        config = parse(_get(http, "/metrics", url).text).cache_config
        if not config:
            raise AttachError(f"{url} is not a vLLM server: its /metrics has no vllm:cache_config_info")
        try:
            sources = _json(http, "/kv_event_sources", url)
        except AttachError:
            sources = {}
        scheduler, device = server_info(http)
    source = event_sources(sources, kv_events, urlsplit(url).hostname)
    kv_bytes = config.get("kv_cache_memory_bytes", "")   # "None" unless vLLM was given a byte budget
    return VllmServer(url=url, version=version, model=models[0]["id"],
                      max_model_len=int(models[0].get("max_model_len") or 0),
                      block_size=int(config.get("block_size", 0)), num_blocks=int(config.get("num_gpu_blocks", 0)),
                      enable_prefix_caching=config.get("enable_prefix_caching") == "True",
                      kv_cache_bytes=int(kv_bytes) if kv_bytes.isdigit() else 0, kv_events=source,
                      scheduler=scheduler, device=device)


def server_info(http: httpx.Client) -> tuple[dict[str, int], str | None]:
    """The scheduler's caps and the device from /server_info (vLLM's dev mode only; else {}, None)."""
    try:
        r = http.get("/server_info", params={"config_format": "json"})
        config = r.json().get("vllm_config") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}, None
    if not isinstance(config, dict):
        return {}, None
    sched = config.get("scheduler_config") or {}
    caps = {k: int(sched[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if isinstance(sched.get(k), int)}
    device = (config.get("device_config") or {}).get("device_type") or (config.get("device_config") or {}).get("device")
    return caps, str(device) if device else None


def version_tuple(version: str) -> tuple[int, ...]:
    """"0.32.0rc1+cpu" -> (0, 32, 0); what cannot be read counts as (0,)."""
    try:
        return Version(version).release
    except InvalidVersion:
        return (0,)


def _get(http: httpx.Client, path: str, url: str) -> httpx.Response:
    try:
        r = http.get(path)
    except httpx.HTTPError as exc:
        raise AttachError(f"cannot reach a vLLM server at {url}: {type(exc).__name__}: {exc or 'no answer'}") from None
    if r.status_code != 200:
        raise AttachError(f"{url} is not a vLLM server: GET {path} answered {r.status_code}")
    return r


def _json(http: httpx.Client, path: str, url: str) -> dict:
    try:
        value = _get(http, path, url).json()
    except ValueError:
        raise AttachError(f"{url} is not a vLLM server: GET {path} did not answer JSON") from None
    if not isinstance(value, dict):
        raise AttachError(f"{url} is not a vLLM server: GET {path} did not answer a JSON object")
    return value


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule (ZmqEventPublisher): it binds wildcard and ipc/inproc endpoints, connects to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def reachable(endpoint: str | None, host: str) -> str | None:
    """A wildcard endpoint vLLM bound, as this machine reaches it: the server's host."""
    if endpoint is None:
        return None
    host = f"[{host}]" if ":" in host else host
    return endpoint.replace("tcp://*:", f"tcp://{host}:").replace("tcp://[::]:", f"tcp://{host}:")


def event_sources(sources: dict, override: str | None, host: str) -> list[KVEventSource]:
    """Each data-parallel rank's publisher, rank 0 first; --kv-events replaces rank 0's address."""
    ranks = sorted(sources.items(), key=lambda kv: int(kv[0])) if sources else []
    configs = [config for _rank, config in ranks if isinstance(config, dict)]
    if not configs and override is None:
        return []
    configs = configs or [{}]
    out = []
    for rank, config in enumerate(configs):
        published = config.get("endpoint") or override
        endpoint = override if (override and rank == 0) else reachable(published, host)
        out.append(KVEventSource(endpoint=endpoint, bind=not is_bind_endpoint(published),
                                 replay_endpoint=reachable(config.get("replay_endpoint"), host),
                                 topic=config.get("topic", "")))
    return out


def local_model_facts(model: str, block_size: int) -> dict | None:
    """hello.model from the checkpoint's config and safetensors headers, when this machine can read them."""
    from kvscope.models.loader import ModelConfig, ModelConfigError
    path = Path(model)
    try:
        raw = json.loads((path / "config.json").read_text())
        cfg = ModelConfig.from_dict(raw, path.name)
    except (OSError, ValueError, ModelConfigError):
        return None
    dtype = str(raw.get("torch_dtype") or raw.get("dtype") or "float32")
    nbytes = DTYPE_BYTES.get(dtype, 2)
    params, weight_bytes = safetensors_size(path)
    return {"name": path.name, "architecture": cfg.architecture, "num_layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size, "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings, "rope_theta": float(cfg.rope_theta),
            "num_params": params, "dtype": dtype, "dtype_reason": "as vLLM's checkpoint stores it (attached)",
            "dtype_bytes": nbytes, "weight_bytes": weight_bytes,
            "kv_bytes_per_token": 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * nbytes,   # K and V
            "tie_word_embeddings": bool(cfg.tie_word_embeddings)}


def safetensors_size(path: Path) -> tuple[int, int]:
    """(parameters, bytes) from the safetensors headers alone (no tensor is read)."""
    params = nbytes = 0
    for f in sorted(path.glob("*.safetensors")):
        with f.open("rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, t in header.items():
            if name != "__metadata__":
                params += math.prod(t["shape"])
                nbytes += t["data_offsets"][1] - t["data_offsets"][0]
    return params, nbytes
