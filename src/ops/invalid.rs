//! Inputs the maths refuses. An op's validation names the bad field by its place in the
//! op's own input (a `Scenario`, a DP-SGD spec) as data; api/ renders the place as a JSON
//! pointer under the request field that carried the input. ops/ writes no pointers.

/// A field's place: names and list indices, outermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(Vec<Segment>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Field(&'static str),
    Index(usize),
}

impl FieldPath {
    /// The input itself.
    pub fn root() -> Self {
        Self::default()
    }

    /// This path's field `name`.
    pub fn field(&self, name: &'static str) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Field(name));
        p
    }

    /// This path's list element `i`.
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Index(i));
        p
    }

    pub fn segments(&self) -> &[Segment] {
        &self.0
    }
}

/// The first bad field of an input, and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub path: FieldPath,
    pub message: String,
}

impl Invalid {
    pub fn new(path: FieldPath, message: impl Into<String>) -> Self {
        Self {
            path,
            message: message.into(),
        }
    }

    /// A bad top-level field of the input.
    pub fn field(name: &'static str, message: impl Into<String>) -> Self {
        Self::new(FieldPath::root().field(name), message)
    }

    /// The same error with its path placed under `outer`, the field holding the input.
    pub fn under(mut self, outer: &'static str) -> Self {
        self.path.0.insert(0, Segment::Field(outer));
        self
    }
}

/// `Ok` when `ok`, else `why` at `path`.
pub fn check(ok: bool, path: FieldPath, why: &str) -> Result<(), Invalid> {
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(path, why))
    }
}
