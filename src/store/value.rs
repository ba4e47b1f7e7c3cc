//! Backend-neutral parameter and row values.
//!
//! Every statement is written once (Postgres placeholders `$1…`); these types carry parameters in and
//! rows out of either backend. Booleans are `BOOLEAN` on Postgres and 0/1 `INTEGER` on SQLite; reading a
//! boolean accepts both.

use std::error::Error as StdError;

use bytes::BytesMut;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// One SQL parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v as i64)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v as i64)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v as i64)
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(v as i64)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::Text(v.clone())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        match v {
            Some(v) => v.into(),
            None => Value::Null,
        }
    }
}

/// Builds a `&[Value]` parameter list: `params![a, b, c]`.
#[macro_export]
macro_rules! params {
    () => { &[] as &[$crate::store::Value] };
    ($($v:expr),+ $(,)?) => { &[$($crate::store::Value::from($v)),+] as &[$crate::store::Value] };
}

impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(v) => match *ty {
                Type::INT2 => i16::try_from(*v)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*v)?.to_sql(ty, out),
                Type::BOOL => (*v != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => v.to_string().to_sql(ty, out),
                _ => v.to_sql(ty, out),
            },
            Value::Text(v) => v.to_sql(ty, out),
            Value::Bool(v) => match *ty {
                Type::INT2 | Type::INT4 | Type::INT8 => (*v as i64).to_sql(&Type::INT8, out),
                _ => v.to_sql(ty, out),
            },
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// One result row, columns in `SELECT` order.
#[derive(Debug, Clone, Default)]
pub struct Row(pub Vec<Value>);

impl Row {
    fn at(&self, i: usize) -> &Value {
        self.0.get(i).unwrap_or(&Value::Null)
    }

    pub fn i64(&self, i: usize) -> i64 {
        self.opt_i64(i).unwrap_or(0)
    }

    pub fn opt_i64(&self, i: usize) -> Option<i64> {
        match self.at(i) {
            Value::Int(v) => Some(*v),
            Value::Bool(b) => Some(*b as i64),
            Value::Text(t) => t.parse().ok(),
            Value::Null => None,
        }
    }

    pub fn str(&self, i: usize) -> String {
        self.opt_str(i).unwrap_or_default()
    }

    pub fn opt_str(&self, i: usize) -> Option<String> {
        match self.at(i) {
            Value::Text(t) => Some(t.clone()),
            Value::Int(v) => Some(v.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Null => None,
        }
    }

    pub fn bool(&self, i: usize) -> bool {
        match self.at(i) {
            Value::Bool(b) => *b,
            Value::Int(v) => *v != 0,
            _ => false,
        }
    }

    pub fn is_null(&self, i: usize) -> bool {
        matches!(self.at(i), Value::Null)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
