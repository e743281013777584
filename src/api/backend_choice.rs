//! `BackendChoice`'s schema, written by hand: serde and clap accept `cuda` as `gpu` (its
//! name before AMD devices had an engine), and a derived schema would not list it, so a
//! generated client would refuse a value the server takes.

use crate::backend::BackendChoice;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;

impl utoipa::PartialSchema for BackendChoice {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .description(Some(
                "Where a job may run: `auto` (where it is predicted to finish first on this \
                 host, from times measured here), `gpu` (a GPU of any vendor: NVIDIA, AMD, one \
                 wgpu reaches (Apple, Vulkan, DX12; the ops it has kernels for), or the \
                 emulated device; 503 device_unavailable where none is usable), `cpu`. `cuda` \
                 is the same choice as `gpu`, its name before 2026-12-02.",
            ))
            .enum_values(Some(["auto", "gpu", "cpu", "cuda"]))
            .into()
    }
}

impl utoipa::ToSchema for BackendChoice {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema lists exactly what serde accepts: each listed value parses, `cuda` as
    /// `gpu`, and a value not listed is refused.
    #[test]
    fn the_schema_lists_what_the_server_accepts() {
        let schema =
            serde_json::to_value(<BackendChoice as utoipa::PartialSchema>::schema()).unwrap();
        let listed: Vec<String> = serde_json::from_value(schema["enum"].clone()).unwrap();
        assert_eq!(listed, ["auto", "gpu", "cpu", "cuda"]);
        let parse = |v: &str| serde_json::from_value::<BackendChoice>(serde_json::json!(v));
        let parsed: Vec<_> = listed.iter().map(|v| parse(v).unwrap()).collect();
        use BackendChoice::*;
        assert_eq!(parsed, [Auto, Gpu, Cpu, Gpu]);
        assert!(parse("hip").is_err() && parse("GPU").is_err());
        // What an answer or a config dump says: the new name.
        assert_eq!(serde_json::to_value(Gpu).unwrap(), "gpu");
    }
}
