//! The tools' schemas, derived from the operations' request and response types and made
//! small: every byte of `tools/list` is in every agent's context, so what tells a model
//! nothing is dropped and output schemas keep only their top level.

use rmcp::model::JsonObject;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// Every byte of `tools/list` is in every agent's context: drops what tells a model nothing
/// (the dialect marker, titles, integer formats, bounds, defaults). In an input schema an
/// optional argument's `null` goes too (leaving it out means the same); an output schema loses
/// its descriptions but keeps `null` (clients validate results against it).
pub fn compact(v: &mut Value, input: bool) {
    let keep_descriptions = input;
    match v {
        Value::Object(o) => {
            o.remove("$schema");
            o.remove("title");
            o.remove("format");
            // Bounds are checked when the call is made, with a message naming them.
            o.remove("minimum");
            o.remove("maximum");
            o.remove("pattern");
            o.remove("minLength");
            o.remove("maxLength");
            // A default says nothing the description does not; an optional argument's `null`
            // is what leaving it out means.
            o.remove("default");
            if let Some(Value::Array(types)) = o.get("type").filter(|_| input) {
                if let [t, n] = types.as_slice() {
                    if n == "null" {
                        let t = t.clone();
                        o.insert("type".into(), t);
                    }
                }
            }
            if !keep_descriptions {
                o.remove("description");
            }
            for (k, child) in o.iter_mut() {
                // `properties` maps names to schemas: a property called `description` stays.
                if k == "properties" || k == "$defs" {
                    if let Value::Object(props) = child {
                        props.values_mut().for_each(|p| compact(p, keep_descriptions));
                    }
                } else {
                    compact(child, keep_descriptions);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| compact(x, keep_descriptions)),
        _ => {}
    }
}

/// An input schema with its `$defs` inlined, and enums of constants (`oneOf` of `const`s,
/// as schemars writes a documented enum) as a plain `enum`.
pub fn inline_defs(schema: &mut Value) {
    let defs = schema
        .as_object_mut()
        .and_then(|o| o.remove("$defs"))
        .unwrap_or(Value::Null);
    fn walk(v: &mut Value, defs: &Value) {
        if let Some(name) = v
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            let mut def = defs.get(name).cloned().unwrap_or(json!({}));
            if let Some(Value::Object(o)) = Some(&mut *v) {
                o.remove("$ref");
                if let Value::Object(d) = &mut def {
                    for (k, x) in std::mem::take(d) {
                        o.entry(k).or_insert(x);
                    }
                }
            }
        }
        if let Some(Value::Array(variants)) = v.get("oneOf") {
            let consts: Option<Vec<Value>> = variants.iter().map(|x| x.get("const").cloned()).collect();
            if let (Some(consts), Value::Object(o)) = (consts, &mut *v) {
                o.remove("oneOf");
                o.insert("enum".into(), Value::Array(consts));
            }
        }
        match v {
            Value::Object(o) => o.values_mut().for_each(|x| walk(x, defs)),
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, defs)),
            _ => {}
        }
    }
    walk(schema, &defs);
}

/// An output schema reduced to its fields' names, each open (`{}`). A model reads the names;
/// a host that validates the structured content against it finds it always valid; the
/// fields' types and nested shapes (a message's fields) are in the text, in `/openapi.json`
/// and in docs/mcp.md, not worth their bytes in every agent's context (docs/benchmarks.md,
/// "Measurements behind design choices").
pub fn shallow(schema: &Value) -> Value {
    let defs = schema.get("$defs").cloned().unwrap_or(Value::Null);
    let root = match schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        Some(name) => defs.get(name).cloned().unwrap_or(json!({})),
        None => schema.clone(),
    };
    let props: serde_json::Map<String, Value> = root
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, _)| (name.clone(), json!({})))
        .collect();
    json!({ "type": "object", "properties": props })
}

/// The argument names a tool accepts, for refusing misspelt ones.
pub fn argument_names(schema: &JsonObject) -> BTreeSet<String> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}
