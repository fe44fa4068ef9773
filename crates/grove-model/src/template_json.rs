//! `tojson` as Hugging Face's chat templates render it: Python's `json.dumps` with
//! `ensure_ascii=False` (`", "` and `": "` between items, keys in their order, no HTML
//! escaping), and its `indent`. minijinja's own filter writes compact, HTML-escaped JSON, which
//! would show a model tool definitions spelled otherwise than in its training.

use std::fmt::Write;

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};

/// The `tojson` filter: `value | tojson` or `value | tojson(indent=2)`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Python's other arguments (`sort_keys`, `separators`, ...) are not used by chat
    // templates; an unknown one fails the render rather than being ignored.
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write(value: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as Json;
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    // With an indent, Python puts items on lines of their own, with no space after a comma.
    let comma = if indent.is_some() { "," } else { ", " };
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                newline(out, depth + 1);
                write(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                newline(out, depth + 1);
                let _ = write!(out, "{}: ", Json::String(key.clone()));
                write(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, value: serde_json::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.add_template("t", template).unwrap();
        env.get_template("t")
            .unwrap()
            .render(minijinja::context! { v => Value::from_serialize(&value) })
            .unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        let value = serde_json::json!({"name": "get_weather", "b": [1, 2.5, null, true],
            "a": {"q": "Zoë's <city> & \"quote\"\n"}, "e": {}, "l": []});
        // json.dumps(value, ensure_ascii=False)
        assert_eq!(
            render("{{ v | tojson }}", value.clone()),
            r#"{"name": "get_weather", "b": [1, 2.5, null, true], "a": {"q": "Zoë's <city> & \"quote\"\n"}, "e": {}, "l": []}"#
        );
        // json.dumps(value, ensure_ascii=False, indent=2)
        assert_eq!(
            render(
                "{{ v | tojson(indent=2) }}",
                serde_json::json!({"a": [1, {"b": 2}], "c": {}})
            ),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ],\n  \"c\": {}\n}"
        );
    }
}
