use serde_json::{Map, json};

use super::*;
use crate::normalize::normalize;
use crate::request::{ChatMessage, ChatRequest, Content};

fn render(source: &str, messages: serde_json::Value) -> Result<String, Error> {
    let t = ChatTemplate::new(source, Map::new())?;
    let input = TemplateInput {
        messages: messages.as_array().cloned().unwrap_or_default(),
        tools: None,
        add_generation_prompt: false,
        continue_final_message: false,
        kwargs: Map::new(),
    };
    t.render(&input)
}

#[test]
fn python_string_methods() {
    let t = ChatTemplate::new(
        "{% set m = messages[0].content %}[{{ m.strip() }}]|[{{ m.lstrip('\\n') }}]|[{{ m.rstrip() }}]|\
         {{ m.split('</think>')[-1] }}|{{ m.startswith('\\n') }}|{{ m.endswith('d ') }}|\
         [{{ '\\x1c a\\x1f'.strip() }}]|{{ m.upper() }}",
        Map::new(),
    )
    .unwrap();
    let input = TemplateInput {
        messages: vec![json!({"role": "user", "content": "\n r</think>\nend "})],
        tools: None,
        add_generation_prompt: false,
        continue_final_message: false,
        kwargs: Map::new(),
    };
    assert_eq!(
        t.render(&input).unwrap(),
        "[r</think>\nend]|[ r</think>\nend ]|[\n r</think>\nend]|\nend |True|True|[a]|\n R</THINK>\nEND "
    );
}

#[test]
fn trim_and_lstrip_blocks_like_hf() {
    let out = render(
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n",
        json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
    )
    .unwrap();
    assert_eq!(out, "[a]\n[b]\n");
}

#[test]
fn tojson_is_python_json_dumps() {
    let out = render(
        "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}|{{ 'é<' | tojson }}",
        json!([{"b": 1.50, "a": [1e16, "x"]}]),
    )
    .unwrap();
    assert_eq!(
        out,
        "{\"b\": 1.5, \"a\": [1e+16, \"x\"]}|{\n  \"b\": 1.5,\n  \"a\": [\n    1e+16,\n    \"x\"\n  ]\n}|\"é<\""
    );
}

#[test]
fn namespace_loop_and_raise_exception() {
    let src = "{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + loop.index0 %}{% endfor %}{{ ns.n }}\
               {% if messages|length > 2 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}";
    assert_eq!(render(src, json!([1, 2])).unwrap(), "1");
    match render(src, json!([1, 2, 3])) {
        Err(Error::Template(msg)) => assert!(msg.contains("too many: 3"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        render("{% if %}", json!([])),
        Err(Error::Template(_))
    ));
    assert!(render("{{ strftime_now('%Y') }}", json!([])).unwrap().len() == 4);
}

#[test]
fn special_tokens_and_kwargs_reach_the_template() {
    let mut special = Map::new();
    special.insert("eos_token".into(), json!("</s>"));
    let t = ChatTemplate::new(
        "{{ eos_token }}{{ custom }}{{ add_generation_prompt }}{{ tools }}",
        special,
    )
    .unwrap();
    let req = ChatRequest {
        chat_template_kwargs: json!({"custom": "!", "eos_token": "E"})
            .as_object()
            .cloned()
            .unwrap(),
        ..Default::default()
    };
    assert_eq!(
        t.render(&normalize(&req).unwrap()).unwrap(),
        "E!TrueNone",
        "Python/Jinja2 spelling of booleans and None"
    );
}

#[test]
fn continue_final_message_cuts_after_content() {
    let cut = |rendered: &str, last: &str| cut_after_final_message(rendered.to_owned(), last);
    assert_eq!(
        cut("<s>A: hi there <e>\n", "hi there ").unwrap(),
        "<s>A: hi there "
    );
    // The template trimmed the trailing space: cut after the stripped text.
    assert_eq!(
        cut("<s>A: hi there<e>\n", "hi there ").unwrap(),
        "<s>A: hi there"
    );
    // The last occurrence wins.
    assert_eq!(cut("x: ok<e>y: ok<e>", "ok").unwrap(), "x: ok<e>y: ok");
    assert!(matches!(
        cut("<s>nothing<e>", "absent"),
        Err(Error::Template(_))
    ));

    let t = ChatTemplate::new(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
        Map::new(),
    )
    .unwrap();
    let req = ChatRequest {
        messages: vec![
            ChatMessage {
                role: "user".into(),
                content: Content::Text("q".into()),
                ..Default::default()
            },
            ChatMessage {
                role: "assistant".into(),
                content: Content::Text("Sure, ".into()),
                ..Default::default()
            },
        ],
        add_generation_prompt: Some(false),
        continue_final_message: Some(true),
        ..Default::default()
    };
    assert_eq!(
        t.render(&normalize(&req).unwrap()).unwrap(),
        "<user>q</>\n<assistant>Sure, "
    );
}
