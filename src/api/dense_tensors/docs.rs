//! OpenAPI schemas of dense tensors, by rank: an operand's (nested numbers, packed, or a
//! resident tensor's id) and an answer's (nested numbers or packed).

use super::PackedTensor;
use utoipa::ToSchema;

/// Nested arrays of numbers of each rank in `ranks` (rectangular, which JSON Schema
/// cannot state), packed, or (an operand, `named`) a resident array's id.
fn nested_or_packed(
    ranks: &[usize],
    named: bool,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{
        ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder, Ref, Schema, SchemaFormat, Type,
    };
    use utoipa::openapi::RefOr;
    let number: RefOr<Schema> = ObjectBuilder::new()
        .schema_type(Type::Number)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double)))
        .into();
    let nested = |rank: usize| {
        (0..rank).fold(number.clone(), |inner, _| {
            ArrayBuilder::new().items(inner).min_items(Some(1)).into()
        })
    };
    let forms = ranks
        .iter()
        .fold(OneOfBuilder::new(), |one_of, &rank| {
            one_of.item(nested(rank))
        })
        .item(Ref::from_schema_name("PackedTensor"));
    if named {
        forms.item(Ref::from_schema_name("ArrayRefDoc")).into()
    } else {
        forms.into()
    }
}

fn packed_tensor_schema(
    schemas: &mut Vec<(
        String,
        utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
    )>,
) {
    use crate::api::array_operands::ArrayRefDoc;
    use utoipa::PartialSchema;
    schemas.push((PackedTensor::name().into(), PackedTensor::schema()));
    <PackedTensor as ToSchema>::schemas(schemas);
    schemas.push((ArrayRefDoc::name().into(), ArrayRefDoc::schema()));
}

/// A schema for `DenseIn` (`named`: true) or `DenseOut` of the given ranks: nested
/// arrays of numbers of each rank, packed, or (an operand) a resident array's id.
macro_rules! dense_doc {
    ($(#[$doc:meta])* $name:ident, $ranks:expr, $named:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                nested_or_packed(&$ranks, $named)
            }
        }

        impl ToSchema for $name {
            fn schemas(
                schemas: &mut Vec<(
                    String,
                    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
                )>,
            ) {
                packed_tensor_schema(schemas);
            }
        }
    };
}

dense_doc!(
    /// Matrices: nested arrays of rank 2 or 3, packed, or a resident tensor's id. The
    /// operations that take them take exactly these ranks.
    DenseDoc,
    [2, 3],
    true
);
dense_doc!(
    /// Matrices in an answer: nested arrays of rank 2 or 3, or packed.
    DenseOutDoc,
    [2, 3],
    false
);
dense_doc!(
    /// Any rank from 1 to 4: a resident tensor's, as uploaded.
    DenseAnyDoc,
    [1, 2, 3, 4],
    true
);
dense_doc!(
    /// Any rank from 1 to 4: a resident tensor's, as answered.
    DenseAnyOutDoc,
    [1, 2, 3, 4],
    false
);
dense_doc!(
    /// Rank 2: an embedding table's `[V, D]`.
    Dense2Doc,
    [2],
    true
);
dense_doc!(
    /// Rank 3: a codebook's `[K, N, 2]` complex beams, or drawn paths' `[B, L, 2]`.
    Dense3Doc,
    [3],
    true
);
dense_doc!(
    /// Rank 3 in an answer: drawn paths' `[B, L, 2]`, a sweep's powers.
    Dense3OutDoc,
    [3],
    false
);
dense_doc!(
    /// Rank 4: attention's `[B, H, S, D]`, or channels' `[B, N_r, N_t, 2]` complex values.
    Dense4Doc,
    [4],
    true
);
dense_doc!(
    /// Rank 4 in an answer: attention's `[B, H, S, D]`, a convolution's output, or
    /// channels' `[B, N_r, N_t, 2]` complex values.
    Dense4OutDoc,
    [4],
    false
);
