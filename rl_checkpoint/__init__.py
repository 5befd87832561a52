"""The trainer -> checkpoint -> server contract, shared by `trainer/` and `serving/` (neither imports the other).

`Storage`: a local path or pyarrow URI. `checkpoint`: the layout, the versioned `CheckpointMetadata`, the run
state, the writer (`RunCheckpoints`) and the reader (`resolve` -> `Checkpoint`). `CheckpointError`: its one error.
"""

from rl_checkpoint.checkpoint import (
    BEST,
    FINAL,
    LATEST,
    METADATA_FILE,
    Checkpoint,
    CheckpointMetadata,
    RunCheckpoints,
    RunState,
    checkpoint_rel,
    iter_name,
    read_metadata,
    read_state,
    resolve,
    write_metadata,
    write_state,
)
from rl_checkpoint.errors import CheckpointError, RegistryError
from rl_checkpoint.evaluation import EvalRecord, latest_eval, read_eval_records, write_eval_record
from rl_checkpoint.gate import GateDecision, judge
from rl_checkpoint.registry import (REGISTRY_PREFIX, PromotionRefused, PromotionResult, Registry, Version,
                                    is_registry_ref, make_ref, parse_ref, resolve_ref)
from rl_checkpoint.storage import Storage, is_uri, redact

__all__ = [
    "BEST", "FINAL", "LATEST", "METADATA_FILE", "Checkpoint", "CheckpointError", "CheckpointMetadata", "EvalRecord",
    "RunCheckpoints", "RunState", "latest_eval", "read_eval_records", "write_eval_record",
    "Storage", "checkpoint_rel", "is_uri", "iter_name", "read_metadata", "read_state", "redact", "resolve",
    "write_metadata", "write_state",
    "REGISTRY_PREFIX", "GateDecision", "PromotionRefused", "PromotionResult", "Registry", "RegistryError", "Version",
    "is_registry_ref", "judge", "make_ref", "parse_ref", "resolve_ref",
]
