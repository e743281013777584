//! `/nn/...`: neural-network layers, one file per operation.
pub mod attention;
pub mod conv2d;

use utoipa_axum::routes;

/// The nn domain's operations and their OpenAPI tag (`api::API_DOMAINS`).
pub(super) const API: super::ApiDomain = super::ApiDomain {
    tag: "nn",
    description: "Neural-network layers: 2-D convolution and fused scaled dot-product attention",
    keyed: true,
    operations,
};

fn operations() -> super::Operations {
    utoipa_axum::router::OpenApiRouter::default()
        .routes(routes!(attention::attention))
        .routes(routes!(conv2d::conv2d))
}
