//! The OpenAPI schemas of the DP releases' vectors and matrices: the operands' forms
//! (numbers, packed, a resident array) and the answers' (numbers, packed).

use super::Packed;
use utoipa::ToSchema;

/// Schema of `Matrix` for the OpenAPI document: rows of numbers (at least one row and
/// one column; all rows as long as the first, which JSON Schema cannot state), or packed.
pub struct MatrixDoc;

/// Schema of `Vector` for the OpenAPI document: at least one number, packed, or a
/// resident array.
pub struct VectorDoc;

/// Schema of `VectorOut` for the OpenAPI document: at least one number, or packed.
pub struct VectorOutDoc;

/// A JSON array of at least one number (f64).
fn numbers() -> utoipa::openapi::schema::ArrayBuilder {
    use utoipa::openapi::schema::{ArrayBuilder, KnownFormat, ObjectBuilder, SchemaFormat, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double))),
        )
        .min_items(Some(1))
}

/// `oneOf` the bare array and a `Packed` reference (the wire forms are untagged), and
/// for an operand a resident array's reference.
fn array_or_packed(
    array: utoipa::openapi::schema::ArrayBuilder,
    operand: bool,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{OneOfBuilder, Ref};
    let forms = OneOfBuilder::new()
        .item(array)
        .item(Ref::from_schema_name("Packed"));
    if operand {
        forms.item(Ref::from_schema_name("ArrayRefDoc")).into()
    } else {
        forms.into()
    }
}

impl utoipa::PartialSchema for MatrixDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        array_or_packed(
            utoipa::openapi::schema::ArrayBuilder::new()
                .items(numbers())
                .min_items(Some(1)),
            true,
        )
    }
}

impl utoipa::PartialSchema for VectorDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        array_or_packed(numbers(), true)
    }
}

impl utoipa::PartialSchema for VectorOutDoc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        array_or_packed(numbers(), false)
    }
}

macro_rules! packed_doc_schema {
    ($($doc:ident: $operand:expr),*) => {$(
        impl ToSchema for $doc {
            fn schemas(
                schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>,
            ) {
                use crate::api::array_operands::ArrayRefDoc;
                use utoipa::PartialSchema;
                schemas.push((Packed::name().into(), Packed::schema()));
                <Packed as ToSchema>::schemas(schemas);
                if $operand {
                    schemas.push((ArrayRefDoc::name().into(), ArrayRefDoc::schema()));
                }
            }
        }
    )*};
}
packed_doc_schema!(MatrixDoc: true, VectorDoc: true, VectorOutDoc: false);
