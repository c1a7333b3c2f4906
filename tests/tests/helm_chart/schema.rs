//! A structural OpenAPI v3 check of a custom resource against its CRD
//! schema, as the API server applies it before CEL: types, required fields,
//! enums, bounds, patterns, int-or-string, and unknown fields (which the
//! API server would prune silently; here they fail, since a pruned field is
//! a setting that never takes effect). `x-kubernetes-validations` (CEL) are
//! not evaluated.

use serde_json::Value;

/// Every violation of `schema` by `value`, as "path: what".
pub fn violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, value, "$", &mut out);
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true && schema.get("properties").is_none()
    {
        return;
    }
    if value.is_null() && schema["nullable"] == true {
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_string() || type_name(value) == "integer") {
            out.push(format!(
                "{path}: {value} is neither an integer nor a string"
            ));
        }
        return;
    }
    // Structural schemas use anyOf/oneOf/allOf/not for value constraints
    // only (int-or-string, which fields go together).
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(alternatives) = schema[key].as_array() {
            let passing = alternatives
                .iter()
                .filter(|alt| violations_at(alt, value, path).is_empty())
                .count();
            let ok = match key {
                "anyOf" => passing > 0,
                "oneOf" => passing == 1,
                _ => passing == alternatives.len(),
            };
            if !ok {
                out.push(format!("{path}: {key} not satisfied by {value}"));
            }
        }
    }
    if schema["not"].is_object() && violations_at(&schema["not"], value, path).is_empty() {
        out.push(format!("{path}: `not` violated by {value}"));
    }
    let actual = type_name(value);
    match schema["type"].as_str() {
        None => {}
        Some("number") if actual == "integer" || actual == "number" => {}
        Some(t) if t != actual => {
            out.push(format!("{path}: expected {t}, found {actual} ({value})"));
            return;
        }
        Some(_) => {}
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        out.push(format!("{path}: {value} is not one of {options:?}"));
    }
    match value {
        Value::Object(map) => {
            let properties = schema["properties"].as_object();
            let additional = &schema["additionalProperties"];
            for (k, v) in map {
                let child = format!("{path}.{k}");
                // ObjectMeta and the type fields are the API server's, not the CRD's.
                if path == "$" && (k == "apiVersion" || k == "kind" || k == "metadata") {
                    continue;
                }
                match properties.and_then(|p| p.get(k)) {
                    Some(s) => check(s, v, &child, out),
                    None if additional.is_object() => check(additional, v, &child, out),
                    // A value constraint (no type) says nothing about fields.
                    None if additional == &Value::Bool(true)
                        || schema["x-kubernetes-preserve-unknown-fields"] == true
                        || schema["type"] != "object" => {}
                    None => out.push(format!("{child}: unknown field")),
                }
            }
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap_or_default();
                if !map.contains_key(r) {
                    out.push(format!("{path}: required field {r} missing"));
                }
            }
            bound(
                schema,
                "minProperties",
                "maxProperties",
                map.len(),
                path,
                out,
            );
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check(&schema["items"], item, &format!("{path}[{i}]"), out);
            }
            bound(schema, "minItems", "maxItems", items.len(), path, out);
        }
        Value::String(s) => {
            bound(
                schema,
                "minLength",
                "maxLength",
                s.chars().count(),
                path,
                out,
            );
            if let Some(p) = schema["pattern"].as_str() {
                match regex::Regex::new(p) {
                    Ok(re) if !re.is_match(s) => {
                        out.push(format!("{path}: {s:?} does not match {p}"))
                    }
                    Ok(_) => {}
                    Err(e) => out.push(format!("{path}: schema pattern {p} unusable: {e}")),
                }
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if let Some(min) = schema["minimum"].as_f64()
                && x < min
            {
                out.push(format!("{path}: {x} < minimum {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && x > max
            {
                out.push(format!("{path}: {x} > maximum {max}"));
            }
        }
        _ => {}
    }
}

fn violations_at(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, value, path, &mut out);
    out
}

fn bound(schema: &Value, min: &str, max: &str, n: usize, path: &str, out: &mut Vec<String>) {
    if let Some(lo) = schema[min].as_u64()
        && (n as u64) < lo
    {
        out.push(format!("{path}: {n} < {min} {lo}"));
    }
    if let Some(hi) = schema[max].as_u64()
        && (n as u64) > hi
    {
        out.push(format!("{path}: {n} > {max} {hi}"));
    }
}
