//! A chat with tools renders as Hugging Face renders it: Qwen2.5-Coder's own template (from its
//! GGUF file) with two tools, an assistant turn that called one and the tool's answer gives,
//! byte for byte, what Python's jinja2 gives with transformers' `tojson` (`json.dumps`,
//! `ensure_ascii=False`): `tests/data/qwen2.5-tools-prompt.txt`, made by rendering the same
//! messages with `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`.

use std::path::PathBuf;

use grove_model::gguf::GgufFile;
use grove_model::ChatMessage;
use serde_json::json;

#[test]
fn qwen_tools_render_as_transformers_renders_them() {
    let models = std::env::var_os("GROVE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = models.join("qwen2.5-coder-0.5b-instruct.gguf");
    if !path.is_file() {
        eprintln!(
            "skipped: {} is absent (python3 scripts/install_models.py)",
            path.display()
        );
        return;
    }
    let tokenizer = GgufFile::open(&path).unwrap().tokenizer().unwrap();
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city; it's <fast> & free",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}),
        json!({"type": "function", "function": {"name": "search_docs",
            "description": "Search the documentation",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                "required": ["query"]}}}),
    ];
    let messages = [
        ChatMessage::text("user", "What's the weather in Paris?"),
        ChatMessage {
            tool_calls: Some(json!([{"id": "call_1", "type": "function", "function":
                {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}])),
            ..ChatMessage::text("assistant", "")
        },
        ChatMessage {
            tool_call_id: Some("call_1".into()),
            ..ChatMessage::text("tool", "{\"temperature\": 18}")
        },
        ChatMessage::text("user", "And in Zürich?"),
    ];
    let rendered = tokenizer
        .apply_chat_template_with_tools(&messages, &tools)
        .unwrap();
    let expected = include_str!("data/qwen2.5-tools-prompt.txt");
    assert_eq!(rendered, expected);
    // Without tools, the template's other branch.
    let plain = tokenizer.apply_chat_template(&messages[..1]).unwrap();
    assert!(!plain.contains("<tools>") && plain.contains("What's the weather"));
}
