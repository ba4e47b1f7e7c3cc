//! The one strict JSON decoder for everything a client sends: every HTTP request body and every
//! WebSocket frame goes through [`from_slice`] / [`parse_value`] + [`from_value`].
//!
//! Derived `Deserialize` impls alone are lenient in ways the contract forbids (docs/reference/websocket.md,
//! docs/reference/http.md): serde accepts a JSON *array* where a struct belongs (fields by position), treats
//! `null` like an absent `Option` field, and `serde_json` keeps the last of duplicate keys. This
//! module decodes through a wrapper [`Deserializer`] over [`Value`] that, for every struct at any
//! depth:
//!
//! - requires a JSON object (an array is a type error);
//! - rejects any key that is not one of the struct's fields (unknown keys, independent of
//!   `deny_unknown_fields` on the type);
//! - rejects `null` for an `Option` field (optional fields are omitted, never `null`);
//!
//! and the text parser rejects duplicate keys (I-JSON, RFC 7493): a text with a duplicate
//! key is treated as not JSON. Wrong types, fractions and exponents for integers are rejected as
//! `serde_json` does. The one field the spec makes *required but nullable* (push `agentState`)
//! opts in explicitly with [`nullable`].
//!
//! Each caller maps an [`Error`] to its route's documented error (`400 invalid_request`,
//! `invalid_control_message`, a first-frame close, …).

use std::collections::HashSet;
use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde_json::{Map, Number, Value};

/// Why a text or value was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Not one JSON text, or a JSON text with a duplicate object key.
    NotJson,
    /// JSON, but the top level is not an object.
    NotObject,
    /// An object that does not match the schema (the message is for tests and debugging only).
    Schema(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotJson => f.write_str("not JSON"),
            Error::NotObject => f.write_str("not a JSON object"),
            Error::Schema(m) => write!(f, "schema: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// Parses one JSON text into a [`Value`], refusing duplicate keys at any depth.
pub fn parse_value(bytes: &[u8]) -> Result<Value, Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = UniqueValue
        .deserialize(&mut de)
        .map_err(|_| Error::NotJson)?;
    de.end().map_err(|_| Error::NotJson)?;
    Ok(v)
}

/// Parses and strictly decodes a body whose top level must be an object.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match parse_value(bytes)? {
        v @ Value::Object(_) => from_value(v),
        _ => Err(Error::NotObject),
    }
}

/// Strictly decodes an already parsed value (the rules of the module doc, at every depth).
pub fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, Error> {
    T::deserialize(Strict(v)).map_err(|e| Error::Schema(e.to_string()))
}

/// Strictly decodes an object (e.g. a frame minus its `type`).
pub fn from_map<T: DeserializeOwned>(m: Map<String, Value>) -> Result<T, Error> {
    from_value(Value::Object(m))
}

/// `deserialize_with` for a *required* key whose value may be `null` (docs/reference/http.md `agentState`):
/// `null` → `None`, a string → `Some`. Pair it with no `#[serde(default)]` so absence is an error.
pub fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(Some(s.to_string()))
        }
        fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
            Ok(Some(s))
        }
    }
    d.deserialize_any(V)
}

// ---------------------------------------------------------------------------------------------
// Text → Value with duplicate-key detection.

struct UniqueValue;

impl<'de> DeserializeSeed<'de> for UniqueValue {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueValue {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(UniqueValue)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(UniqueValue)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

// ---------------------------------------------------------------------------------------------
// Value → T with the strict struct rules.

struct Strict(Value);

type E = serde_json::Error;

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

struct StrictSeq(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for StrictSeq {
    type Error = E;
    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, s: S) -> Result<Option<S::Value>, E> {
        match self.0.next() {
            Some(v) => s.deserialize(Strict(v)).map(Some),
            None => Ok(None),
        }
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct StrictMap {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for StrictMap {
    type Error = E;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, s: K) -> Result<Option<K::Value>, E> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                let kd: de::value::StringDeserializer<E> = k.into_deserializer();
                s.deserialize(kd).map(Some)
            }
            None => Ok(None),
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, s: V) -> Result<V::Value, E> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("value before key"))?;
        s.deserialize(Strict(v))
    }
}

fn seq<'de, V: Visitor<'de>>(v: Value, visitor: V) -> Result<V::Value, E> {
    match v {
        Value::Array(a) => visitor.visit_seq(StrictSeq(a.into_iter())),
        other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
    }
}

fn map<'de, V: Visitor<'de>>(v: Value, visitor: V) -> Result<V::Value, E> {
    match v {
        Value::Object(m) => visitor.visit_map(StrictMap {
            iter: m.into_iter(),
            value: None,
        }),
        other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
    }
}

macro_rules! forward_to_value {
    ($($name:ident)*) => {
        $(fn $name<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
            self.0.$name(visitor)
        })*
    };
}

impl<'de> Deserializer<'de> for Strict {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Array(_) => seq(self.0, visitor),
            Value::Object(_) => map(self.0, visitor),
            other => other.deserialize_any(visitor),
        }
    }

    /// `null` is never a value of an optional field.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        match self.0 {
            Value::Null => Err(de::Error::custom("null is not allowed")),
            v => visitor.visit_some(Strict(v)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, E> {
        match &self.0 {
            Value::Object(m) => {
                let known: HashSet<&str> = fields.iter().copied().collect();
                if let Some(k) = m.keys().find(|k| !known.contains(k.as_str())) {
                    return Err(de::Error::unknown_field(k, fields));
                }
                map(self.0, visitor)
            }
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        map(self.0, visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        seq(self.0, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, E> {
        seq(self.0, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, E> {
        seq(self.0, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, E> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, E> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, E> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        drop(self);
        visitor.visit_unit()
    }

    forward_to_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_unit
        deserialize_identifier
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Inner {
        a: u64,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Outer {
        v: u8,
        key_b64: String,
        #[serde(default)]
        opt: Option<String>,
        inner: Option<Inner>,
        list: Option<Vec<Inner>>,
        #[serde(deserialize_with = "nullable")]
        state: Option<String>,
    }

    fn p(s: &str) -> Result<Outer, Error> {
        from_slice(s.as_bytes())
    }

    #[test]
    fn accepts_the_documented_shape() {
        let o = p(r#"{"v":1,"keyB64":"k","inner":{"a":2},"list":[{"a":3}],"state":null}"#).unwrap();
        assert_eq!(o.inner, Some(Inner { a: 2 }));
        assert_eq!(o.state, None);
        assert_eq!(o.opt, None);
        let o = p(r#"{"v":1,"keyB64":"k","state":"x","opt":"y"}"#).unwrap();
        assert_eq!(o.state.as_deref(), Some("x"));
        assert_eq!(o.opt.as_deref(), Some("y"));
    }

    #[test]
    fn refuses_every_lenient_form() {
        let cases = [
            (r#"[1,"k",null,null,null,null]"#, Error::NotObject),
            (r#"null"#, Error::NotObject),
            (r#""x""#, Error::NotObject),
            (r#"{"v":1,"keyB64":"k","state":null,"v":1}"#, Error::NotJson),
            (r#"{"v":1,"keyB64":"k","state":null} x"#, Error::NotJson),
            (
                r#"{"v":1,"keyB64":"k","inner":{"a":1,"a":2},"state":null}"#,
                Error::NotJson,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(p(text).unwrap_err(), want, "{text}");
        }
        let schema = [
            r#"{"v":1,"keyB64":"k","state":null,"opt":null}"#,
            r#"{"v":1,"keyB64":"k","state":null,"inner":null}"#,
            r#"{"v":1,"keyB64":"k","state":null,"inner":[2]}"#,
            r#"{"v":1,"keyB64":"k","state":null,"inner":{"a":1,"b":2}}"#,
            r#"{"v":1,"keyB64":"k","state":null,"list":[[3]]}"#,
            r#"{"v":1,"keyB64":"k","state":null,"extra":1}"#,
            r#"{"v":1,"keyB64":"k"}"#,
            r#"{"v":1.0,"keyB64":"k","state":null}"#,
            r#"{"v":1e0,"keyB64":"k","state":null}"#,
            r#"{"v":"1","keyB64":"k","state":null}"#,
            r#"{"v":1,"keyB64":null,"state":null}"#,
            r#"{"v":1,"keyB64":"k","state":3}"#,
        ];
        for text in schema {
            assert!(matches!(p(text), Err(Error::Schema(_))), "{text}");
        }
    }
}
