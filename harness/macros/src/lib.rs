//! `#[guard_test]`: registers a test function with guard's test harness (the `guard-test` crate),
//! with what it needs to run.
//!
//! ```ignore
//! #[guard_test(needs = [root, ebpf])]
//! fn a_pile_is_ended() { … }
//!
//! #[guard_test(needs = [redis])]
//! async fn the_mirror_writes_a_heartbeat() { … }   // on a current-thread tokio runtime
//!
//! #[guard_test(multi_thread)]
//! async fn two_workers() { … }                     // on a 2-worker tokio runtime
//!
//! #[guard_test(ignore = "a measurement: run with --ignored --nocapture")]
//! fn measure() { … }
//! ```
//!
//! Each name in `needs` is a `guard_test::Need` variant in snake case (`memory_cgroup` →
//! `Need::MemoryCgroup`), so a misspelt need does not compile. The function is left as written;
//! the attribute adds a `static` in `guard_test::TESTS` that names it.
//!
//! Written with `proc_macro` alone (no syn/quote): the attribute only needs the function's name,
//! whether it is `async`, and that it takes no arguments.
use proc_macro::{Delimiter, TokenStream, TokenTree};

#[proc_macro_attribute]
pub fn guard_test(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr, item.clone()) {
        Ok(registration) => {
            let mut out = item;
            out.extend(registration);
            out
        }
        Err(message) => {
            let mut out: TokenStream = format!("::core::compile_error!({message:?});").parse().unwrap();
            out.extend(item);
            out
        }
    }
}

/// What the attribute says.
#[derive(Default)]
struct Args {
    needs: Vec<String>,
    ignore: Option<String>,
    multi_thread: bool,
}

fn expand(attr: TokenStream, item: TokenStream) -> Result<TokenStream, String> {
    let args = parse_args(attr)?;
    let (name, is_async) = parse_fn(item)?;
    if args.multi_thread && !is_async {
        return Err(format!("#[guard_test(multi_thread)] is for an async fn; `{name}` is not async"));
    }
    let needs: Vec<String> = args.needs.iter().map(|n| format!("::guard_test::Need::{}", camel(n))).collect();
    let ignore = match &args.ignore {
        Some(why) => format!("::core::option::Option::Some({why:?})"),
        None => "::core::option::Option::None".to_string(),
    };
    let run = if is_async {
        let builder = if args.multi_thread {
            "::tokio::runtime::Builder::new_multi_thread().worker_threads(2)"
        } else {
            "::tokio::runtime::Builder::new_current_thread()"
        };
        format!("|| {builder}.enable_all().build().expect(\"a tokio runtime for the test\").block_on({name}())")
    } else {
        name.clone()
    };
    let registration = format!(
        "#[::guard_test::linkme::distributed_slice(::guard_test::TESTS)]
         #[linkme(crate = ::guard_test::linkme)]
         #[allow(non_upper_case_globals)]
         static __guard_test_{name}: ::guard_test::Test = ::guard_test::Test {{
             name: {name:?},
             module: ::core::module_path!(),
             needs: &[{needs}],
             ignore: {ignore},
             run: {run},
         }};",
        needs = needs.join(", "),
    );
    registration.parse().map_err(|e| format!("guard_test: {e}"))
}

/// `needs = [a, b]`, `ignore = "why"`, `multi_thread`, separated by commas.
fn parse_args(attr: TokenStream) -> Result<Args, String> {
    let mut args = Args::default();
    let mut tokens = attr.into_iter().peekable();
    while let Some(token) = tokens.next() {
        let TokenTree::Ident(key) = token else { return Err(format!("guard_test: unexpected `{token}`")) };
        let key = key.to_string();
        let has_value = matches!(tokens.peek(), Some(TokenTree::Punct(p)) if p.as_char() == '=');
        if has_value {
            tokens.next();
        }
        match (key.as_str(), has_value) {
            ("needs", true) => match tokens.next() {
                Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket => {
                    for t in g.stream() {
                        match t {
                            TokenTree::Ident(need) => args.needs.push(need.to_string()),
                            TokenTree::Punct(p) if p.as_char() == ',' => {}
                            other => {
                                return Err(format!("guard_test: `{other}` is not a need (e.g. needs = [root, ebpf])"))
                            }
                        }
                    }
                }
                _ => return Err("guard_test: needs = [..] takes a list, e.g. needs = [root, ebpf]".into()),
            },
            ("ignore", true) => match tokens.next() {
                Some(TokenTree::Literal(lit)) => {
                    let text = lit.to_string();
                    let why = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'));
                    args.ignore = Some(why.ok_or("guard_test: ignore = \"why\" takes a string")?.replace("\\\"", "\""));
                }
                _ => return Err("guard_test: ignore = \"why\" takes a string".into()),
            },
            ("multi_thread", false) => args.multi_thread = true,
            _ => {
                return Err(format!(
                    "guard_test: unknown argument `{key}` (needs = [..], ignore = \"..\", multi_thread)"
                ))
            }
        }
        match tokens.next() {
            None => break,
            Some(TokenTree::Punct(p)) if p.as_char() == ',' => {}
            Some(other) => return Err(format!("guard_test: expected `,`, found `{other}`")),
        }
    }
    Ok(args)
}

/// The function's name and whether it is `async`; an error for anything but a `fn` without
/// arguments.
fn parse_fn(item: TokenStream) -> Result<(String, bool), String> {
    let mut is_async = false;
    let mut tokens = item.into_iter();
    while let Some(token) = tokens.next() {
        match &token {
            TokenTree::Ident(i) if i.to_string() == "async" => is_async = true,
            TokenTree::Ident(i) if i.to_string() == "fn" => {
                let Some(TokenTree::Ident(name)) = tokens.next() else { break };
                let name = name.to_string();
                match tokens.next() {
                    Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis && g.stream().is_empty() => {
                        return Ok((name, is_async))
                    }
                    _ => return Err(format!("#[guard_test] fn {name} must take no arguments")),
                }
            }
            _ => {}
        }
    }
    Err("#[guard_test] goes on a fn".into())
}

/// `memory_cgroup` → `MemoryCgroup`.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
        })
        .collect()
}
