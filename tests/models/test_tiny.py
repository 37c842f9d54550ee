import json
import os

import pytest
import torch

from hybridflow.models.tiny import CHARACTERS, build_tiny_config, build_tiny_model, build_tiny_tokenizer, main


def char_id(c: str) -> int:
    # 4 specials come first, then printable ASCII 32..126 in order, then "\n"
    return 99 if c == "\n" else 4 + ord(c) - 32


def test_vocab_layout_and_specials():
    tok = build_tiny_tokenizer()
    assert len(tok) == 100 < 128
    assert len(CHARACTERS) == 96
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert tok.padding_side == "left"
    # '0' is ASCII 48 -> 4 + 16 = 20; 'a' is 97 -> 69; ' ' -> 4; '\n' -> 99
    assert tok("0a \n", add_special_tokens=False)["input_ids"] == [20, 69, 4, 99]


def test_every_character_is_one_token_and_round_trips():
    tok = build_tiny_tokenizer()
    text = "".join(CHARACTERS) + "Tom's 23+45=68\n#### 68  \\boxed{3}"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == [char_id(c) for c in text]
    assert tok.decode(ids) == text


def test_chat_template_is_chatml_without_system():
    tok = build_tiny_tokenizer()
    msgs = [{"role": "user", "content": "1+1?"}]
    s = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert s == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[:2] == [1, char_id("u")] and ids[-1] == char_id("\n")
    assert ids.count(1) == 2 and ids.count(2) == 1
    assert len(ids) == len("user\n1+1?") + 1 + 1 + 1 + 1 + len("assistant\n")


def test_saved_directory_loads_with_auto_classes(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = set(os.listdir(tiny_model_dir))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    built = build_tiny_tokenizer()
    text = "<|im_start|>user\nA box has 12 pens.\n\n#### 7<|im_end|>\n"
    # AutoTokenizer picks Qwen2Tokenizer for model_type qwen2; it must tokenize like the built one
    assert tok(text)["input_ids"] == built(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.padding_side == "left" and tok.pad_token_id == 0 and tok.eos_token_id == 2
    batch = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == [[0, 0, 69, 70], [69, 70, 71, 72]]

    gen = json.load(open(os.path.join(tiny_model_dir, "generation_config.json")))
    assert gen["eos_token_id"] == 2 and gen["pad_token_id"] == 0 and gen["top_k"] == 0

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == 100 and model.config.tie_word_embeddings
    n_params = sum(p.numel() for p in model.parameters())
    # per layer: q 128*128+128, k/v 2*(128*64+64), o 128*128, mlp 3*128*256, 2 norms 2*128
    per_layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 256 + 2 * 128
    assert n_params == 4 * per_layer + 100 * 128 + 128  # + tied embedding + final norm = 604,800
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 20, 21]])).logits
    assert logits.shape == (1, 3, 100)


def test_same_seed_same_weights_and_rng_untouched():
    cfg = build_tiny_config(100, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_tiny_model(cfg, seed=0).state_dict()
    after = torch.rand(1)
    assert torch.equal(before, after)  # building a model must not consume the caller's RNG
    b = build_tiny_model(cfg, seed=0).state_dict()
    c = build_tiny_model(cfg, seed=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.parametrize(
    "head, cls_name, out_shape",
    [
        ("token_classification", "Qwen2ForTokenClassification", (1, 3, 1)),  # a critic's value per token
        ("sequence_classification", "Qwen2ForSequenceClassification", (1, 1)),  # a reward model's score
    ],
)
def test_value_and_reward_heads_share_the_body_of_the_same_seed(head, cls_name, out_shape):
    cfg = build_tiny_config(
        100,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        num_labels=1,
        classifier_dropout=0.0,
    )
    model = build_tiny_model(cfg, seed=0, head=head)
    assert type(model).__name__ == cls_name and model.config.num_labels == 1
    assert model(input_ids=torch.tensor([[5, 20, 21]])).logits.shape == out_shape
    lm = build_tiny_model(cfg, seed=0)
    assert torch.equal(model.model.embed_tokens.weight, lm.model.embed_tokens.weight)
    with pytest.raises(ValueError, match="value_head.*causal_lm, token_classification, sequence_classification"):
        build_tiny_model(cfg, head="value_head")


def test_unknown_arch_names_the_choices():
    with pytest.raises(ValueError, match="gpt9.*qwen2, llama"):
        build_tiny_config(100, arch="gpt9")


def test_cli_writes_a_llama_directory(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    out = str(tmp_path / "llama")
    main(["--out", out, "--arch", "llama", "--seed", "3", "--num_layers", "1", "--untied"])
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == 1 and not cfg.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("a\nb", add_special_tokens=False)["input_ids"] == [69, 99, 70]


def test_chat_template_renders_tools_and_tool_turns_hermes_style():
    tok = build_tiny_tokenizer()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "d",
                "parameters": {
                    "type": "object",
                    "properties": {"expr": {"type": "string"}, "digits": {"type": "integer"}},
                },
            },
        },
        {"type": "function", "function": {"name": "now", "description": "no parameters"}},
    ]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": "1+2"}}}],
        },
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "#### 3"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\ncalc(expr, digits)\nnow()\n</tools><|im_end|>\n"
        "<|im_start|>user\nq<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n#### 3<|im_end|>\n"
    )
    # without tools a system message is an ordinary turn, exactly as before
    assert (
        tok.apply_chat_template(msgs[:2], tokenize=False)
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
    )
