use super::*;
use crate::api::problem::ERROR_CODES;

/// (path, method, operation) for every operation of the finished document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            out.push((path.clone(), method.clone(), op.clone()));
        }
    }
    out
}

fn statuses(op: &Value) -> Vec<String> {
    op["responses"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

#[test]
fn every_operation_documents_its_kinds_shared_problems() {
    let doc = document();
    let jobs = job_requests(&doc);
    assert!(jobs.len() >= 8, "{jobs:?}");
    for (path, method, op) in operations(&doc) {
        let has = statuses(&op);
        let want = |s: &str| assert!(has.contains(&s.to_string()), "{method} {path} lacks {s}");
        want("500");
        if op["security"].to_string().contains("bearer") {
            want("401");
            want("429");
        }
        if op.get("requestBody").is_some() {
            ["400", "408", "413", "415", "422", "503"]
                .iter()
                .for_each(|s| want(s));
        }
        if op
            .get("parameters")
            .is_some_and(|p| !p.as_array().unwrap().is_empty())
        {
            want("422");
        }
        if is_job(op.as_object().unwrap(), &jobs) {
            want("503");
            want("504");
            assert!(
                op["responses"]["200"]["headers"]["x-backend"].is_object(),
                "{path}"
            );
        }
    }
}

#[test]
fn every_problem_response_has_the_schema_and_an_example_of_its_status() {
    for (path, method, op) in operations(&document()) {
        for (status, response) in op["responses"].as_object().unwrap() {
            let status: u16 = status.parse().unwrap();
            if status < 400 {
                continue;
            }
            let media = &response["content"]["application/problem+json"];
            assert_eq!(
                media["schema"]["$ref"], "#/components/schemas/ProblemDocument",
                "{method} {path} {status}"
            );
            let example = &media["example"];
            assert_eq!(example["status"], status, "{method} {path}: {example}");
            let code = example["code"].as_str().unwrap();
            assert!(
                ERROR_CODES.iter().any(|(c, _, _)| *c == code),
                "{method} {path}: unknown code {code}"
            );
            assert_eq!(example["type"], format!("urn:gpu-ops:problem:{code}"));
        }
    }
}

#[test]
fn generator_unfriendly_shapes_are_gone() {
    let doc = document();
    let text = doc.to_string();
    assert!(!text.contains("\"operation_id\""), "links in snake case");
    fn walk(v: &Value, at: &str) {
        match v {
            Value::Object(m) => {
                assert!(
                    !(m.contains_key("default") && m.contains_key("oneOf")),
                    "default beside oneOf at {at}"
                );
                for (k, x) in m {
                    walk(x, &format!("{at}/{k}"));
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, at)),
            _ => {}
        }
    }
    walk(&doc, "");
    for (path, _, op) in operations(&doc) {
        for (status, response) in op["responses"].as_object().unwrap() {
            for (media, body) in response["content"].as_object().into_iter().flatten() {
                assert!(
                    body.get("schema").is_some(),
                    "{path} {status} {media} has no schema"
                );
            }
        }
    }
    let events = &doc["paths"]["/datasets/{id}/events"]["get"]["responses"]["200"]["content"]
        ["text/event-stream"];
    assert_eq!(
        events["x-itemSchema"]["properties"]["data"]["contentSchema"]["$ref"],
        "#/components/schemas/DatasetView"
    );
}

#[test]
fn element_vectors_are_bare_arrays_or_strings_or_name_an_array() {
    let doc = document();
    let shapes: Vec<String> = doc["components"]["schemas"]["ElementsDoc"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["type"]
                .as_str()
                .or(s["$ref"].as_str())
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        shapes,
        ["array", "string", "#/components/schemas/ArrayRefDoc"]
    );
    let reference = &doc["components"]["schemas"]["ArrayRefDoc"];
    assert_eq!(reference["required"], serde_json::json!(["array"]));
    assert_eq!(reference["properties"].as_object().unwrap().len(), 1);
}

#[test]
fn examples_are_what_the_server_renders() {
    let e = example(ErrorCode::InvalidParameter, 422, "/history_limit");
    assert_eq!(e["errors"][0]["path"], "/history_limit");
    assert_eq!(e["detail"], "/history_limit: out of range");
    // http_error is the one code whose status varies.
    assert_eq!(example(ErrorCode::HttpError, 405, "")["status"], 405);
}

/// A hand-written expectation for one operation of each kind, independent of the
/// rules `shared_problems` applies.
#[test]
fn operations_of_each_kind_document_the_statuses_they_return() {
    let doc = document();
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "/zk/field_add",
            "post",
            &[
                "200", "400", "401", "408", "410", "413", "415", "422", "429", "500", "503", "504",
            ],
        ),
        (
            "/dp/accountant/epsilon",
            "post",
            &[
                "200", "400", "401", "408", "413", "415", "422", "429", "500", "503",
            ],
        ),
        (
            "/dp/budgets/{id}",
            "get",
            &["200", "401", "404", "422", "429", "500", "503"],
        ),
        (
            "/datasets/synthetic",
            "post",
            &[
                "202", "400", "401", "408", "413", "415", "422", "429", "500", "503", "507",
            ],
        ),
        ("/health/live", "get", &["200", "500"]),
    ];
    for (path, method, want) in cases {
        let mut has = statuses(&doc["paths"][path][method]);
        has.sort();
        assert_eq!(has, *want, "{method} {path}");
    }
    let example = &doc["paths"]["/dp/budgets/{id}"]["get"]["responses"]["422"]["content"]
        ["application/problem+json"]["example"];
    assert_eq!(example["errors"][0]["path"], "/id", "{example}");
}

/// SDK users rely on the README's list of operation ids and schema names: a rename
/// must update it, deliberately.
#[test]
fn the_readme_lists_every_operation_id_and_schema_name() {
    let readme = include_str!("../../../README.md");
    let section = readme
        .split("## Generated clients")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has a Generated clients section");
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().unwrap().keys();
    for name in schemas {
        assert!(
            section.contains(&format!("`{name}`")),
            "README lacks `{name}`"
        );
    }
    // The table: one row per tag, listing exactly that tag's operation ids.
    for (path, method, op) in operations(&doc) {
        let id = op["operationId"].as_str().unwrap();
        let tag = op["tags"][0].as_str().unwrap();
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| `{tag}` |")))
            .unwrap_or_else(|| panic!("README has no row for tag {tag}"));
        assert!(
            row.contains(&format!("`{id}`")),
            "{method} {path}: `{id}` not in the {tag} row"
        );
    }
}
