//! Whether a text is well-formed XML, as a generated document (an SVG figure) must be: one root
//! element, every element closed in order, attribute values quoted (no `<` in them, each name
//! once per element), `&` only as an entity, nothing but white space and comments around the
//! root. An XML declaration may open the document; DTDs, CDATA sections and processing
//! instructions are refused (a generator that writes them needs a real parser in its test).

/// The names of `text`'s elements in document order, or why it is not well-formed.
pub fn elements(text: &str) -> Result<Vec<String>, String> {
    let mut rest = text.trim_start();
    if let Some(after) = rest.strip_prefix("<?xml") {
        let end = after
            .find("?>")
            .ok_or("an XML declaration without its end")?;
        rest = &after[end + 2..];
    }
    let mut open: Vec<String> = Vec::new();
    let mut names = Vec::new();
    loop {
        let Some(lt) = rest.find('<') else {
            check_text(rest)?;
            if !rest.trim().is_empty() && open.is_empty() {
                return Err(format!("text after the root element: {:?}", rest.trim()));
            }
            break;
        };
        let before = &rest[..lt];
        check_text(before)?;
        if open.is_empty() && !before.trim().is_empty() {
            return Err(format!(
                "text outside the root element: {:?}",
                before.trim()
            ));
        }
        rest = &rest[lt..];
        if let Some(after) = rest.strip_prefix("<!--") {
            let end = after.find("-->").ok_or("a comment without its end")?;
            rest = &after[end + 3..];
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').ok_or("an end tag without '>'")?;
            let name = after[..end].trim_end();
            match open.pop() {
                Some(o) if o == name => {}
                o => return Err(format!("</{name}> closes {o:?}")),
            }
            rest = &after[end + 1..];
        } else {
            if open.is_empty() && !names.is_empty() {
                return Err("a second root element".into());
            }
            let (name, after, closed) = start_tag(&rest[1..])?;
            names.push(name.to_string());
            if !closed {
                open.push(name.to_string());
            }
            rest = after;
        }
    }
    match (open.last(), names.is_empty()) {
        (Some(o), _) => Err(format!("<{o}> is never closed")),
        (None, true) => Err("no root element".into()),
        (None, false) => Ok(names),
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_alphanumeric() || "_:.-".contains(c))
}

/// A start tag after its `<`: its name, the text after its `>`, and whether it closed itself.
fn start_tag(s: &str) -> Result<(&str, &str, bool), String> {
    let end = s
        .find(|c: char| c.is_whitespace() || c == '/' || c == '>')
        .ok_or("a tag without '>'")?;
    let name = &s[..end];
    if !is_name(name) {
        return Err(format!("a bad element name {name:?}"));
    }
    let mut rest = &s[end..];
    let mut seen: Vec<&str> = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("/>") {
            return Ok((name, after, true));
        }
        if let Some(after) = rest.strip_prefix('>') {
            return Ok((name, after, false));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("<{name}>: an attribute without '='"))?;
        let attr = rest[..eq].trim_end();
        if !is_name(attr) || seen.contains(&attr) {
            return Err(format!("<{name}>: a bad or repeated attribute {attr:?}"));
        }
        seen.push(attr);
        let value = rest[eq + 1..].trim_start();
        let quote = value
            .chars()
            .next()
            .filter(|&q| q == '"' || q == '\'')
            .ok_or_else(|| format!("<{name}>: attribute {attr} not quoted"))?;
        let close = value[1..]
            .find(quote)
            .ok_or_else(|| format!("<{name}>: attribute {attr} never ends"))?;
        let v = &value[1..1 + close];
        if v.contains('<') {
            return Err(format!("<{name}>: '<' in attribute {attr}"));
        }
        check_text(v)?;
        rest = &value[close + 2..];
    }
}

/// `&` only as `&name;` of XML's five entities or a character reference.
fn check_text(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        let after = &rest[amp + 1..];
        let end = after
            .find(';')
            .ok_or_else(|| format!("a bare '&' in {text:?}"))?;
        let entity = &after[..end];
        let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
            || entity
                .strip_prefix("#x")
                .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
            || entity
                .strip_prefix('#')
                .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
        if !ok {
            return Err(format!("an unknown entity &{entity}; in {text:?}"));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::elements;

    #[test]
    fn well_formed_documents_pass_and_broken_ones_do_not() {
        let ok = "<?xml version=\"1.0\"?>\n<svg a=\"1\" b='x &amp; y'><!-- c --><g><text>a &lt; b</text></g><rect/></svg>\n";
        assert_eq!(elements(ok).unwrap(), ["svg", "g", "text", "rect"]);
        for bad in [
            "",
            "<svg>",
            "<svg></g>",
            "<svg><g></svg></g>",
            "<svg a=1/>",
            "<svg a=\"1\" a=\"2\"/>",
            "<svg a=\"<\"/>",
            "<svg>a & b</svg>",
            "<svg>&nbsp;</svg>",
            "<svg/><svg/>",
            "text<svg/>",
            "<svg/>text",
            "<svg><1/></svg>",
        ] {
            assert!(elements(bad).is_err(), "{bad:?} passed");
        }
    }
}
