"""The chat formats people train with, token in and token out (docs/models.md).

Each family's chat format (agentgym's template of it, `modeling/templates/`)
rides on a tokenizer trained offline on BabyAI's text, with that family's
special tokens; a tiny model plays BabyAI through the real `hf` policy. What
the learner trains on must be exactly what the model was given and sampled,
and, where the template is prefix-stable, exactly what the template renders
for the whole conversation.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from chat_episodes import OBSERVATIONS, check_deltas, check_trajectory, play, rendered_ids
from jinja2.exceptions import TemplateError
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentgym_core.rollout.chat as chat_module
from agentgym_core.modeling import CHAT_FORMATS, TinyModelConfig, env_corpus, init_model
from agentgym_core.modeling.chat_templates import (
    TEMPLATE_DIR,
    TRAINING_VARIANTS,
    read_template,
)
from agentgym_core.modeling.tokenizer import ChatTemplateName, train_tokenizer
from agentgym_core.rollout.chat import (
    PRIMING_REPLY,
    ChatFormat,
    ChatTemplateError,
    set_chat_template_kwargs,
)

pytest.importorskip("agentgym_env_babyai")

FAMILIES = [name for name in CHAT_FORMATS if name not in ("chatml", "llama3")]
VARIANTS = [(name, {}) for name in FAMILIES]
VARIANTS.insert(FAMILIES.index("qwen3") + 1, ("qwen3", {"enable_thinking": False}))
SIZE = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64}


def _id(variant) -> str:
    name, kwargs = variant
    return name + "".join(f"-{k}={v}" for k, v in kwargs.items())


@pytest.fixture(scope="module")
def babyai():
    """A factory of real BabyAI environments (through the plugin registry) and its corpus."""
    from agentgym_core.plugins import PluginHost

    registration = PluginHost().registry.get("environment", "babyai")
    config = registration.config(levels=["PutNextLocal"])

    def make():
        return registration.factory(config)

    env = make()
    try:
        texts = env_corpus(env, list(env.tasks("train"))[:20], max_turns=4)
    finally:
        env.close()
    return make, texts


@pytest.fixture(scope="module")
def models(babyai, tmp_path_factory):
    """A tiny model folder per family, built once, loaded as `model.path` would load it."""
    _, texts = babyai
    built = {}

    def load(name):
        if name not in built:
            config = TinyModelConfig(chat_template=name, vocab_size=512, **SIZE)
            out = init_model(texts, tmp_path_factory.mktemp(name), config)
            built[name] = out
        out = built[name]
        return AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)

    return load


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_the_learner_trains_on_what_the_model_was_given_and_sampled(babyai, models, variant):
    name, kwargs = variant
    model, tokenizer = models(name)
    set_chat_template_kwargs(tokenizer, kwargs)
    make, _ = babyai
    env = make()
    instruction = env.instruction()
    for task, constrained in [(0, True), (1, True), (2, False)]:
        chat, traj, calls = play(make, model, tokenizer, task, constrained=constrained)
        first = env.reset(task)
        check_trajectory(chat, traj, calls, instruction, first, constrained=constrained)
    env.close()


@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_deltas_are_the_templates_own_user_turns(babyai, variant):
    """Templates trim or wrap user text (Llama 3.x, Gemma trim it); a delta must do the same."""
    name, kwargs = variant
    _, texts = babyai
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template=name)
    set_chat_template_kwargs(tokenizer, kwargs)
    chat = ChatFormat(tokenizer, _generation_config(tokenizer, name))
    check_deltas(chat, OBSERVATIONS)


# Each family's format, written out: " Hi " / "Ok." / "Go" with the generation prompt, then
# the same with the system message "Be brief." first (None: the family has no system role).
_LLAMA_SYSTEM = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
)
_LLAMA_TURNS = (
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nOk.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nGo<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
_CHATML_TURNS = (
    "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\nOk.<|im_end|>\n"
    "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n"
)
_GEMMA_TURNS = (
    "<start_of_turn>user\n{}Hi<end_of_turn>\n<start_of_turn>model\nOk.<end_of_turn>\n"
    "<start_of_turn>user\nGo<end_of_turn>\n<start_of_turn>model\n"
)
_PHI_TURNS = (
    "<|im_start|>user<|im_sep|> Hi <|im_end|><|im_start|>assistant<|im_sep|>Ok.<|im_end|>"
    "<|im_start|>user<|im_sep|>Go<|im_end|><|im_start|>assistant<|im_sep|>"
)
_R1_TURNS = (
    "<｜User｜> Hi <｜Assistant｜>Ok.<｜end▁of▁sentence｜><｜User｜>Go<｜Assistant｜><think>\n"
)
FORMATS = {
    "qwen2_5": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n" + _CHATML_TURNS,
        "<|im_start|>system\nBe brief.<|im_end|>\n" + _CHATML_TURNS,
    ),
    "qwen3": (_CHATML_TURNS, "<|im_start|>system\nBe brief.<|im_end|>\n" + _CHATML_TURNS),
    "llama3_1": (
        _LLAMA_SYSTEM + "<|eot_id|>" + _LLAMA_TURNS,
        _LLAMA_SYSTEM + "Be brief.<|eot_id|>" + _LLAMA_TURNS,
    ),
    "llama3_2": (
        _LLAMA_SYSTEM + "<|eot_id|>" + _LLAMA_TURNS,
        _LLAMA_SYSTEM + "Be brief.<|eot_id|>" + _LLAMA_TURNS,
    ),
    "mistral": (
        "<s>[INST]  Hi [/INST] Ok.</s>[INST] Go[/INST]",
        "<s>[INST]  Hi [/INST] Ok.</s>[INST] Be brief.\n\nGo[/INST]",  # the last user turn
    ),
    "gemma2": ("<bos>" + _GEMMA_TURNS.format(""), None),
    "gemma3": ("<bos>" + _GEMMA_TURNS.format(""), "<bos>" + _GEMMA_TURNS.format("Be brief.\n\n")),
    "phi4": (_PHI_TURNS, "<|im_start|>system<|im_sep|>Be brief.<|im_end|>" + _PHI_TURNS),
    "deepseek_r1_distill": (
        "<｜begin▁of▁sentence｜>" + _R1_TURNS,
        "<｜begin▁of▁sentence｜>Be brief." + _R1_TURNS,
    ),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_each_template_renders_its_familys_format(name):
    tokenizer = train_tokenizer(["Hi. Ok. Go."], vocab_size=300, chat_template=name)
    turns = [
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "Go"},
    ]
    system = {"role": "system", "content": "Be brief."}
    kwargs = {"date_string": "26 Jul 2024"} if name == "llama3_2" else {}

    def render(messages, prompt=True, **extra):
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=prompt, **kwargs, **extra
        )

    plain, with_system = FORMATS[name]
    assert render(turns) == plain
    if with_system is None:
        with pytest.raises(TemplateError, match="system"):
            render([system, *turns])
    else:
        assert render([system, *turns]) == with_system


def test_the_reasoning_behaviours_of_qwen3_and_deepseek_r1_distill():
    reasoned = {"role": "assistant", "content": "<think>\nR\n</think>\n\nA"}
    turns = [{"role": "user", "content": "u"}, reasoned, {"role": "user", "content": "o"}]
    qwen3 = train_tokenizer(["u o A R"], vocab_size=300, chat_template="qwen3")
    assert qwen3.apply_chat_template(turns[:2], tokenize=False) == (
        "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
    )
    assert qwen3.apply_chat_template(turns, tokenize=False) == (
        "<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\no<|im_end|>\n"
    ), "an assistant turn before the last user turn loses its reasoning"
    assert qwen3.apply_chat_template(
        turns[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False
    ).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    r1 = train_tokenizer(["u o A R"], vocab_size=300, chat_template="deepseek_r1_distill")
    assert r1.apply_chat_template(turns[:2], tokenize=False) == (
        "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜>\n\nA<｜end▁of▁sentence｜>"
    )


def _generation_config(tokenizer, name):
    from transformers import GenerationConfig

    stops = CHAT_FORMATS[name].stop_tokens
    eos = tokenizer.convert_tokens_to_ids(list(stops)) if stops else tokenizer.eos_token_id
    return GenerationConfig(eos_token_id=eos)


def test_turns_end_with_the_templates_end_of_turn_token_not_the_first_eos(babyai):
    """Llama 3.1 lists <|end_of_text|> first among its eos ids, Gemma <eos>; turns end otherwise."""
    _, texts = babyai
    for name, end in [("llama3_1", "<|eot_id|>"), ("gemma3", "<end_of_turn>")]:
        tokenizer = train_tokenizer(texts, vocab_size=512, chat_template=name)
        chat = ChatFormat(tokenizer, _generation_config(tokenizer, name))
        assert tokenizer.decode(chat.stop_ids[:1]) == end
        assert len(chat.stop_ids) == len(CHAT_FORMATS[name].stop_tokens)
        assert chat.action_ids("drop")[-1] == tokenizer.convert_tokens_to_ids(end)


@pytest.mark.parametrize("name", sorted(TRAINING_VARIANTS))
def test_templates_that_rewrite_history_are_swapped_with_a_notice(
    babyai, name, monkeypatch, capsys
):
    _, texts = babyai
    monkeypatch.setattr(chat_module, "_NOTICED", set())
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template=name)
    original = tokenizer.chat_template
    turns = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "<think>\nthe key is left\n</think>\n\nturn left"},
    ]
    one = tokenizer.apply_chat_template(turns, tokenize=False)
    two = tokenizer.apply_chat_template(
        [*turns, {"role": "user", "content": "You see a key."}], tokenize=False
    )
    assert "the key is left" not in two, "the shipped original does rewrite history"
    assert not two.startswith(one) or "<think>" not in two

    first = ChatFormat(tokenizer)
    ChatFormat(tokenizer)
    notice = capsys.readouterr().err
    assert notice.count("agentgym: note:") == 1, "the notice is printed once"
    assert TRAINING_VARIANTS[name] in notice
    assert first.template == read_template(TRAINING_VARIANTS[name])
    assert tokenizer.chat_template == original, "the tokenizer itself is left alone"
    ids = first.template_ids([*turns, {"role": "user", "content": "You see a key."}])
    assert "the key is left" in tokenizer.decode(ids)
    assert first.decode_action(tokenizer.encode("<think>\nhm\n</think>\n\nturn left")) == (
        "turn left"
    )


# Qwen3's behaviour, written nothing like templates/qwen3.jinja: an assistant turn that a
# user turn follows loses everything up to its last </think>.
QWEN3_LOOKALIKE = (
    "{%- set roles = messages | map(attribute='role') | list -%}"
    "{%- for m in messages -%}"
    "{%- set text = m.content -%}"
    "{%- if m.role == 'assistant' and 'user' in roles[loop.index0 + 1 :] -%}"
    "{%- set text = (text.split('</think>') | last).lstrip() -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' ~ m.role ~ '\\n' ~ text ~ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{{ '<|im_start|>assistant\\n' if add_generation_prompt else '' }}"
)


@pytest.mark.parametrize(
    "template",
    [QWEN3_LOOKALIKE, read_template("qwen3") + "{#- a local edit #}"],
    ids=["written-differently", "edited"],
)
def test_a_template_is_recognised_by_its_behaviour_not_its_text(
    babyai, template, monkeypatch, capsys
):
    _, texts = babyai
    monkeypatch.setattr(chat_module, "_NOTICED", set())
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template="qwen3")
    tokenizer.chat_template = template
    chat = ChatFormat(tokenizer)
    assert "re-renders earlier turns" in capsys.readouterr().err
    assert chat.template == read_template("qwen3_training")
    turns = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "<think>\nthe key is left\n</think>\n\nturn left"},
        {"role": "user", "content": "You see a key."},
    ]
    assert "the key is left" in tokenizer.decode(chat.template_ids(turns))
    assert chat.template_ids(turns[:1]) == tokenizer.apply_chat_template(
        turns[:1], add_generation_prompt=True, return_dict=False
    ), "the variant opens the conversation as the checkpoint's template does"


def test_an_unknown_template_that_rewrites_history_fails_naming_the_remedy(babyai):
    _, texts = babyai
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template="qwen3")
    # Qwen3's history rewriting, but the generation prompt opens <think>: neither family's.
    tokenizer.chat_template = QWEN3_LOOKALIKE.replace(
        "'<|im_start|>assistant\\n' if", "'<|im_start|>assistant\\n<think>\\n' if"
    )
    assert tokenizer.chat_template != QWEN3_LOOKALIKE
    with pytest.raises(ChatTemplateError, match="re-renders earlier turns.*model.tokenizer_path"):
        ChatFormat(tokenizer)
    # Qwen3's behaviour, but a default system prompt that qwen3_training does not write.
    tokenizer.chat_template = "{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}" + (
        QWEN3_LOOKALIKE
    )
    with pytest.raises(ChatTemplateError, match="renders the opening prompt differently"):
        ChatFormat(tokenizer)
    # DeepSeek-R1-Distill's first release: no <think> in the generation prompt, reasoning cut.
    original = read_template("deepseek_r1_distill")
    tokenizer.chat_template = original.replace("'<｜Assistant｜><think>\\n'", "'<｜Assistant｜>'")
    assert tokenizer.chat_template != original
    with pytest.raises(ChatTemplateError, match="drops an assistant turn's reasoning"):
        ChatFormat(tokenizer)


def test_a_template_must_end_turns_with_a_stop_token(babyai):
    _, texts = babyai
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template="gemma2")
    with pytest.raises(ChatTemplateError, match="<end_of_turn>.*eos_token"):
        ChatFormat(tokenizer)  # <eos> alone: Gemma's generation config adds <end_of_turn>


def test_every_shipped_template_has_a_chat_format_and_is_described():
    readme = (TEMPLATE_DIR / "README.md").read_text()
    shipped = {p.stem for p in TEMPLATE_DIR.glob("*.jinja")}
    training = set(TRAINING_VARIANTS.values())
    assert shipped - training == set(FAMILIES)
    assert set(get_args(ChatTemplateName)) == set(CHAT_FORMATS)
    for name in shipped:
        assert f"`{name}.jinja`" in readme, name
    docs = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    for name in FAMILIES:
        assert f"`{name}`" in docs, name


def test_model_init_takes_a_chat_template(tmp_path):
    from agentgym_core.cli import main

    out = tmp_path / "gemma3"
    argv = ["model", "init", "--env", "babyai", "--env-option", "levels=[GoToObj]"]
    argv += ["--tasks", "3", "--size", "hidden_size=32", "--size", "intermediate_size=64"]
    assert main([*argv, "--chat-template", "gemma3", "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == read_template("gemma3")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert tokenizer.decode(model.generation_config.eos_token_id) == "<eos><end_of_turn>"


def test_an_opening_prompt_is_rendered_once_per_task(babyai, monkeypatch):
    """A group's episodes open on the same task: the template runs once for all of them."""
    _, texts = babyai
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template="chatml")
    chat = ChatFormat(tokenizer)
    renders = []
    render = chat._render
    monkeypatch.setattr(chat, "_render", lambda *a, **k: renders.append(a) or render(*a, **k))
    first = chat.prompt_ids("Play.", OBSERVATIONS[0])
    first.append(-1)  # the caller's list is its own
    again = chat.prompt_ids("Play.", OBSERVATIONS[0])
    other = chat.prompt_ids("Play.", OBSERVATIONS[1])
    assert len(renders) == 2
    assert (
        again
        == first[:-1]
        == rendered_ids(
            chat,
            [
                {"role": "user", "content": "Play."},
                {"role": "assistant", "content": PRIMING_REPLY},
                {"role": "user", "content": OBSERVATIONS[0]},
            ],
            generation_prompt=True,
        )
    )
    assert other != again


def test_a_run_that_crosses_midnight_keeps_the_date_it_started_with(babyai, monkeypatch):
    """Llama 3.2 writes today's date into every prompt; a new day must not rewrite history."""
    import datetime as real_datetime

    import transformers.utils.chat_template_utils as template_utils

    class Clock:
        now_is = real_datetime.datetime(2026, 11, 28, 23, 59, 59)

        @classmethod
        def now(cls):
            return cls.now_is

    monkeypatch.setattr(template_utils, "datetime", Clock)  # the template's strftime_now
    monkeypatch.setattr(chat_module, "datetime", Clock)  # the clock ChatFormat freezes
    _, texts = babyai
    tokenizer = train_tokenizer(texts, vocab_size=512, chat_template="llama3_2")
    assert "Today Date: 28 Nov 2026" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "u"}], tokenize=False
    ), "the template reads the clock the test moves"
    chat = ChatFormat(tokenizer)
    before = tokenizer.decode(chat.prompt_ids("Play.", OBSERVATIONS[0]))
    Clock.now_is = real_datetime.datetime(2026, 11, 29, 0, 0, 1)
    after = tokenizer.decode(chat.prompt_ids("Play.", OBSERVATIONS[1]))
    chat.observation_ids(OBSERVATIONS[2])  # raised "re-renders earlier turns" before
    assert "Today Date: 28 Nov 2026" in before and "Today Date: 28 Nov 2026" in after
    assert "Today Date: 28 Nov 2026" in tokenizer.decode(
        ChatFormat(tokenizer).template_ids([{"role": "user", "content": "u"}])
    ), "a second ChatFormat of the same tokenizer (the policy's, the engine's) shares the date"
    set_chat_template_kwargs(tokenizer, {"date_string": "01 Jan 2025"})
    pinned = tokenizer.decode(ChatFormat(tokenizer).prompt_ids("Play.", OBSERVATIONS[0]))
    assert "Today Date: 01 Jan 2025" in pinned, "model.chat_template_kwargs still fixes it"
