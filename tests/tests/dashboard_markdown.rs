//! The dashboard's safe Markdown renderer (`broker/web/lib/markdown.js`) in a real
//! headless Chromium, served by a real `relay up` to a logged-in page:
//!
//! - a table of Markdown inputs renders to exactly the expected DOM (tags, text, hrefs,
//!   the attributes a link gets);
//! - hostile inputs (`<script>`, `<img onerror>`, javascript:/data:/vbscript:/file:
//!   links and autolinks, terminal escapes, bidi overrides, emphasis bombs, a 1 MB
//!   line, ...) produce no script, iframe, img or other active element, no `on*`
//!   attribute, no href but http(s), run nothing, show all their text, and finish (the
//!   time each took is printed, not asserted);
//! - re-rendering a 20 KB reply as it streams reuses the blocks already shown (the
//!   nodes before the last blocks are the same objects) and ends equal to a fresh render;
//! - behind the renderer: no module of the page (`broker/web/**.js`) uses an HTML or
//!   script sink (innerHTML, document.write, eval, ...), and every file the page is
//!   served carries the Content-Security-Policy that allows only its own script.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::browser::{login_client, login_cookie, Browser};
use relay_tests::RelayProcess;
use serde_json::{json, Value};

/// `markdown(input).innerHTML` for each input, rendered in the page.
async fn rendered(b: &Browser, inputs: &[&str]) -> Vec<String> {
    let out = b
        .js(&format!(
            "import('/lib/markdown.js').then(m => {}.map(s => m.markdown(s).innerHTML))",
            json!(inputs)
        ))
        .await;
    out.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

const LINK: &str = r#"rel="noopener noreferrer" target="_blank""#;

#[tokio::test(flavor = "multi_thread")]
async fn markdown_renders_the_subset_agents_write_and_keeps_hostile_input_inert() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let b = Browser::logged_in(&relay, "dashboard_markdown", "tester").await;
    // Should a view ever put agent text in as HTML, the page's policy still runs none of it.
    let (client, cookie) = (login_client(), login_cookie(&relay, "csp").await);
    for path in ["/", "/app.js", "/lib/markdown.js", "/views/flight.js"] {
        let resp = client
            .get(format!("{}{path}", relay.api.url))
            .header("Cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let csp = resp.headers()["content-security-policy"].to_str().unwrap();
        for want in [
            "default-src 'none'",
            "script-src 'self';",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(want), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
    }

    let cases: Vec<(&str, String)> = vec![
        (
            "# Title\n\nSome *em* and **strong** and `code`.",
            "<h1>Title</h1><p>Some <em>em</em> and <strong>strong</strong> and <code>code</code>.</p>".into(),
        ),
        ("Heading\n===\ntext\n---", "<h1>Heading</h1><h2>text</h2>".into()),
        ("### h3 ###", "<h3>h3</h3>".into()),
        (
            "*a **b** c* _d_ __e__ ***f*** snake_case_name",
            "<p><em>a <strong>b</strong> c</em> <em>d</em> <strong>e</strong> <em><strong>f</strong></em> snake_case_name</p>".into(),
        ),
        (
            "- a\n- b\n  - c\n  - d\n- e",
            "<ul><li>a</li><li>b<ul><li>c</li><li>d</li></ul></li><li>e</li></ul>".into(),
        ),
        (
            "1. one\n2. two\n\n3. three",
            "<ol><li><p>one</p></li><li><p>two</p></li><li><p>three</p></li></ol>".into(),
        ),
        ("3) three\n4) four", r#"<ol start="3"><li>three</li><li>four</li></ol>"#.into()),
        (
            "> quote\n> more\n\n---\n\npara",
            "<blockquote><p>quote\nmore</p></blockquote><hr><p>para</p>".into(),
        ),
        (
            "```rust\nfn main() { <b> }\n```\nafter",
            r#"<pre class="md-code" data-lang="rust"><span class="md-lang">rust</span><code>fn main() { &lt;b&gt; }</code></pre><p>after</p>"#.into(),
        ),
        (
            "| a | b |\n|:--|--:|\n| 1 | `2\\|` |\n| 3 |",
            r#"<div class="md-table-wrap"><table class="md-table"><thead><tr><th class="align-left">a</th><th class="align-right">b</th></tr></thead><tbody><tr><td class="align-left">1</td><td class="align-right"><code>2|</code></td></tr><tr><td class="align-left">3</td><td class="align-right"></td></tr></tbody></table></div>"#.into(),
        ),
        ("foo  \nbar\\\nbaz \\*not em\\*", "<p>foo<br>bar<br>baz *not em*</p>".into()),
        (
            "[x](https://example.com \"t\") <https://a.b/c> and https://x.y/z).",
            format!(
                r#"<p><a href="https://example.com/" {LINK} title="t">x</a> <a href="https://a.b/c" {LINK}>https://a.b/c</a> and <a href="https://x.y/z" {LINK}>https://x.y/z</a>).</p>"#
            ),
        ),
        (
            "[**bold** link](http://e.x/a_(b)_c)",
            format!(r#"<p><a href="http://e.x/a_(b)_c" {LINK}><strong>bold</strong> link</a></p>"#),
        ),
        (
            "![alt text](https://evil.example/x.png)",
            r#"<p><span class="md-image">[image: alt text] <span class="md-url">https://evil.example/x.png</span></span></p>"#.into(),
        ),
    ];
    let inputs: Vec<&str> = cases.iter().map(|(i, _)| *i).collect();
    let got = rendered(&b, &inputs).await;
    for ((input, want), got) in cases.iter().zip(&got) {
        assert_eq!(got, want, "markdown({input:?})");
    }

    // Links to anything but http(s) are shown as text: no href at all.
    let inert_links = [
        "[y](javascript:alert(1))",
        "[J](JaVaScRiPt:alert(1))",
        "[t](\tjavascript:alert(1))",
        "[c](\u{1}java\u{0}script:alert(1))",
        "[d](data:text/html,<script>alert(1)</script>)",
        "[v](vbscript:msgbox)",
        "[f](file:///etc/passwd)",
        "[r](src/main.rs)",
        "[p](//evil.example/x)",
        "<javascript:alert(1)>",
        "<data:text/html,x>",
    ];
    for (input, html) in inert_links.iter().zip(rendered(&b, &inert_links).await) {
        assert!(!html.contains("href"), "{input:?} -> {html}");
    }
    assert_eq!(
        rendered(&b, &["[y](javascript:alert(1))"]).await[0],
        r#"<p><span class="md-inert-link">y <span class="md-url">(javascript:alert(1))</span></span></p>"#
    );
    // Whitespace and control characters around an http(s) URL do not stop it being one,
    // and do not reach the href.
    assert_eq!(
        rendered(&b, &["[h]( HTTPS://ok.example/\u{7f} )"]).await[0],
        format!(r#"<p><a href="https://ok.example/" {LINK}>h</a></p>"#)
    );

    // Terminal escapes and invisible characters are shown escaped, as everywhere.
    assert_eq!(
        rendered(&b, &["esc \u{1b}[31mred\u{1b}[0m \u{202e}rtl `\u{1b}[1m`"]).await[0],
        r#"<p>esc <span class="ctl">\x1b</span>[31mred<span class="ctl">\x1b</span>[0m <span class="ctl">\u{202e}</span>rtl <code><span class="ctl">\x1b</span>[1m</code></p>"#
    );

    // Hostile inputs: rendered into the document, nothing active, everything shown.
    let hostile = b
        .js(r#"import('/lib/markdown.js').then(async (m) => {
            window.__pwned = 0;
            const big = (s, n) => s.repeat(n);
            const inputs = {
              script: "<script>window.__pwned = 1</script> <b onclick=x>b</b>",
              img: "<img src=x onerror='window.__pwned = 2'> ![x](javascript:window.__pwned=3)",
              iframe: "<iframe src=https://example.com></iframe><svg onload=x>",
              links: "[a](javascript:window.__pwned=4) [b](data:text/html,<script>x</script>) <javascript:x> <vbscript:x> [c](file:///x) [d](JAVASCRIPT%3Ax)",
              autolink: "javascript:alert(1) http://x.y/\"onmouseover=\"alert(1) https://a.b/<script>",
              escapes: "\x1b[31mred\x1b[0m \x1b]8;;https://evil\x07link\x1b]8;;\x07 \u202e\u200b\u2066",
              rule: big("*", 10000),
              stars: "x " + big("*", 10000) + " y",
              nested: big("*a ", 5000) + "b" + big(" c*", 5000),
              strongs: big("**a ", 5000) + big(" a**", 5000),
              unders: big("_a_", 100000),
              brackets: big("[](", 100000),
              linkfill: big("[](" + big("(a)", 20), 5000),
              ticks: big("`a``", 50000),
              quotes: big("> ", 50000) + "deep",
              lists: big("- ", 50000) + "deep",
              urls: big("(http://(", 50000),
              line: big("x", 1 << 20),
            };
            const out = {};
            const host = document.createElement("div");
            document.body.append(host);
            for (const [k, src] of Object.entries(inputs)) {
              const t = performance.now();
              const node = m.markdown(src);
              const ms = performance.now() - t;
              host.replaceChildren(node);
              const all = [...node.querySelectorAll("*")];
              out[k] = {
                ms: Math.round(ms),
                active: node.querySelectorAll("script,iframe,img,object,embed,style,link,svg,math,form,input,video,audio,source,base,meta").length,
                on: all.filter((e) => [...e.attributes].some((a) => /^on/i.test(a.name))).length,
                attrs: [...new Set(all.flatMap((e) => [...e.attributes].map((a) => a.name)))].sort(),
                hrefs: all.filter((e) => e.hasAttribute("href")).map((e) => e.getAttribute("href")),
                depth: (function d(e) { let x = 0; for (const c of e.children) x = Math.max(x, d(c)); return x + 1; })(node),
                len: node.textContent.length,
                srcLen: src.length,
              };
            }
            await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 50)));
            host.remove();
            return { out, pwned: window.__pwned };
        })"#)
        .await;
    assert_eq!(hostile["pwned"], 0, "{hostile}");
    let allowed = [
        "class",
        "data-lang",
        "href",
        "rel",
        "start",
        "target",
        "title",
    ];
    for (name, r) in hostile["out"].as_object().unwrap() {
        println!(
            "markdown hostile input {name}: {} chars in {} ms",
            r["srcLen"], r["ms"]
        );
        assert_eq!(r["active"], 0, "{name}: {r}");
        assert_eq!(r["on"], 0, "{name}: {r}");
        for a in r["attrs"].as_array().unwrap() {
            assert!(allowed.contains(&a.as_str().unwrap()), "{name}: {r}");
        }
        for h in r["hrefs"].as_array().unwrap() {
            let h = h.as_str().unwrap();
            assert!(
                h.starts_with("http://") || h.starts_with("https://"),
                "{name}: {h}"
            );
        }
        // The nesting the page lays out stays shallow, whatever the input nests.
        assert!(r["depth"].as_u64().unwrap() <= 30, "{name}: {r}");
    }
    let out = &hostile["out"];
    // All of a long line and of the emphasis bombs is shown (as text).
    assert_eq!(out["line"]["len"], 1 << 20);
    assert_eq!(out["stars"]["len"], out["stars"]["srcLen"]);
    // A line of 10,000 `*` alone is a horizontal rule, as CommonMark has it.
    assert_eq!(out["rule"]["len"], 0);
    assert_eq!(out["brackets"]["len"], out["brackets"]["srcLen"]);
    assert_eq!(
        out["autolink"]["hrefs"],
        json!(["http://x.y/%22onmouseover=%22alert(1)", "https://a.b/"])
    );

    // Streaming: a 20 KB reply re-rendered as it grows reuses the blocks it showed.
    let stream: Value = b
        .js(r#"import('/lib/markdown.js').then((m) => {
            const parts = [];
            for (let i = 0; parts.join("").length < 20000; i++) parts.push(`## Part ${i}\n\nSome *text* with \`code\` and a [link](https://e.x/${i}).\n\n- item one\n- item **two**\n\n| a | b |\n|---|---|\n| ${i} | x |\n\n\`\`\`js\nlet x = ${i};\n\`\`\`\n`);
            const doc = parts.join("\n");
            const host = document.createElement("div");
            document.body.append(host);
            m.renderMarkdown(host, doc.slice(0, 2000));
            const first = host.firstChild;
            const times = [];
            for (let n = 2000; n <= doc.length; n += 41) {
              const t = performance.now();
              m.renderMarkdown(host, doc.slice(0, n));
              host.offsetHeight;
              times.push(performance.now() - t);
            }
            m.renderMarkdown(host, doc);
            const kept = host.firstChild === first;
            const same = host.innerHTML === m.markdown(doc).innerHTML;
            times.sort((a, b) => a - b);
            const t = performance.now();
            m.markdown(doc);
            const full = performance.now() - t;
            host.remove();
            return { kept, same, frames: times.length, median: times[times.length >> 1], p95: times[Math.floor(times.length * 0.95)], full, len: doc.length };
        })"#)
        .await;
    println!("markdown streaming a 20 KB reply: {stream}");
    assert_eq!(stream["kept"], true, "{stream}");
    assert_eq!(stream["same"], true, "{stream}");
}

/// The page's modules put text into the DOM as nodes only (`text()`, `h()`, `setText`,
/// or `lib/markdown.js`): no line of code in them (comments aside) names an HTML or
/// script sink, so no agent text can reach one.
#[test]
fn no_module_of_the_page_uses_an_html_or_script_sink() {
    const SINKS: &[&str] = &[
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "createContextualFragment",
        "DOMParser",
        "srcdoc",
        "javascript:",
        "setAttribute(\"on",
        "setTimeout(\"",
        "setInterval(\"",
    ];
    let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../broker/web");
    let mut dirs = vec![web];
    let mut modules = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "js") {
                continue;
            }
            modules += 1;
            let src = std::fs::read_to_string(&path).unwrap();
            for (n, line) in src.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") || code.starts_with('*') || code.starts_with("/*") {
                    continue;
                }
                for sink in SINKS {
                    assert!(
                        !code.contains(sink),
                        "{}:{}: {sink}: {line}",
                        path.display(),
                        n + 1
                    );
                }
            }
        }
    }
    assert!(modules > 10, "the page's modules were read: {modules}");
}
