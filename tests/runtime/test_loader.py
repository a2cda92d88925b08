"""The model loader on real files (the tiny random pair): what it posts, where it stands, and that a
worker of an earlier request is dropped."""

from __future__ import annotations

from dflash_chat.runtime.events import LoadProgress, ModelFailed, ModelLoaded
from dflash_chat.runtime.loader import LoadOptions, ModelLoader
from dflash_chat.runtime.model_source import ModelSource
from tests.ui.conftest import tiny_pair  # noqa: F401 - a fixture

OPTIONS = LoadOptions(context_length=256, device="cpu")


class Owner:
    """Applies each event as it is posted, and remembers it with the status it left."""

    def __init__(self, spawn) -> None:
        self.seen = []
        self.loader = ModelLoader(self.post, spawn, OPTIONS)

    def post(self, event) -> None:
        self.seen.append((event, self.loader.handle(event), self.loader.status))


def test_files_load_with_progress_and_the_status_follows(tiny_pair):  # noqa: F811
    target, drafter = tiny_pair
    owner = Owner(lambda body, group: body())
    source = ModelSource(str(target), str(drafter))
    owner.loader.begin(source)
    events = [event for event, _, _ in owner.seen]
    progress = [e for e in events if isinstance(e, LoadProgress)]
    assert progress and all(a.done <= b.done for a, b in zip(progress, progress[1:], strict=False))
    assert progress[-1].done == progress[-1].total > 0
    assert isinstance(events[-1], ModelLoaded) and all(fresh for _, fresh, _ in owner.seen)
    assert [status.stage for _, _, status in owner.seen] == ["loading"] * len(progress) + ["ready"]
    assert owner.seen[0][2].what == str(target)  # named by its files until the pair names itself
    loader = owner.loader
    assert loader.pair is events[-1].model and loader.source is source
    assert loader.status.what == loader.name() == loader.pair.target_name
    assert loader.pair.engine.max_context == 256


def test_a_load_asked_for_before_the_last_one_finished_is_dropped(tiny_pair, tmp_path):  # noqa: F811
    target, drafter = tiny_pair
    bodies = []
    owner = Owner(lambda body, group: bodies.append(body))
    owner.loader.begin(ModelSource(str(target), str(drafter)))
    owner.loader.begin(ModelSource(str(tmp_path / "gone"), None))  # asked for before the first one ran
    bodies[0]()
    assert owner.seen and not any(fresh for _, fresh, _ in owner.seen)  # every event of the first is stale
    assert owner.loader.pair is None and owner.loader.status.stage == "loading"
    bodies[1]()
    event, fresh, status = owner.seen[-1]
    assert isinstance(event, ModelFailed) and fresh and status.stage == "failed"
    assert "gone" in status.error and owner.loader.pair is None


def test_a_draft_above_the_pairs_most_is_fitted_as_it_loads_and_when_the_setting_changes(tiny_pair):  # noqa: F811
    """The limit (a drafter's block - 1) is known once the pair is loaded: the load fits the setting and notes
    it (run, serve and the chat show the note), and a later change of the setting is fitted alike."""
    from dataclasses import replace

    from dflash_chat.engine import rules
    from dflash_chat.runtime.session import EngineSession

    target, drafter = tiny_pair
    owner = Owner(lambda body, group: body())
    owner.loader.options = replace(OPTIONS, draft=40)
    owner.loader.begin(ModelSource(str(target), str(drafter)))
    pair = owner.loader.pair
    most = pair.engine.block_size - 1
    assert pair.engine.draft == most and pair.notes == (rules.fit_draft(40, most)[1],)
    session = EngineSession(pair)
    session.use_draft(3)
    assert pair.engine.draft == 3
    session.use_draft(most + 5)
    assert pair.engine.draft == most


def _mmproj(path, out_hidden: int):
    import torch

    from dflash_chat.engine.models.vision import VisionConfig, VisionTower
    from tests.engine.gguf_write import write_mmproj_gguf

    vision = {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
        "out_hidden_size": out_hidden,
    }
    torch.manual_seed(0)
    return write_mmproj_gguf(path, VisionTower(VisionConfig.from_dict(vision)).state_dict(), vision, out_hidden)


def test_the_vision_tower_loads_with_the_pair_unless_vision_is_off(tmp_path):
    from dataclasses import replace

    from dflash_chat.engine.models.vision import VisionTower
    from tests.engine.tiny_vlm import write_vlm, write_vlm_tokenizer

    target, drafter = tmp_path / "vlm", None  # a target whose tokenizer has the image tokens a tower needs
    write_vlm(target)
    write_vlm_tokenizer(target)
    tower = _mmproj(tmp_path / "mmproj-F16.gguf", 64)
    owner = Owner(lambda body, group: body())
    owner.loader.begin(ModelSource(str(target), drafter, vision=str(tower)))
    pair = owner.loader.pair
    assert pair is not None and isinstance(pair.vision, VisionTower), owner.seen[-1]
    assert pair.vision.merger.linear_fc2.weight.dtype == pair.dtype  # on the target's device, in its dtype
    progress = [e for e, _, _ in owner.seen if isinstance(e, LoadProgress)]
    assert progress[-1].done == progress[-1].total  # the tower's bytes counted in the bar

    owner.loader.options = replace(OPTIONS, vision="off")  # the setting changed: the same files again, no tower
    owner.loader.reload()
    assert owner.loader.pair is not None and owner.loader.pair is not pair and owner.loader.pair.vision is None
    assert owner.loader.source is not None and owner.loader.source.vision == str(tower)

    owner.loader.options = OPTIONS
    owner.loader.begin(ModelSource(str(target), drafter, vision=str(_mmproj(tmp_path / "other.gguf", 48))))
    event = owner.seen[-1][0]
    assert isinstance(event, ModelFailed) and "\n" not in event.error
    assert "48-wide features, the target's hidden size is 64" in event.error
