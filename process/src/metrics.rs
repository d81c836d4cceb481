//! Metrics declared once: [`metrics!`](crate::metrics!) makes a plane's metric struct from
//! one entry per metric (its doc, type, first value, and the name and help it is
//! registered under), so a metric cannot be declared and not registered, or registered
//! under a name its doc does not go with.

/// Declares a struct of metrics and `fn registered(&mut Registry) -> (Self, &mut Registry)`,
/// which creates every metric, registers each entry that has `=> "name", "help"` under the
/// struct's prefix, and returns the prefixed registry for the metrics that register
/// themselves (collectors, counter pairs).
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// use prometheus_client::registry::Registry;
///
/// holdfast_process::metrics! {
///     /// The example's metrics.
///     #[derive(Clone, Debug)]
///     pub struct Example under "example" {
///         /// Things done.
///         done: Counter = Counter::default() => "done", "Things done";
///         /// Registered by hand.
///         other: Counter = Counter::default();
///     }
/// }
///
/// let mut registry = Registry::default();
/// let (metrics, prefixed) = Example::registered(&mut registry);
/// prefixed.register("other", "Registered by hand", metrics.other.clone());
/// metrics.done.inc();
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("example_done_total 1"));
/// assert!(text.contains("example_other_total 0"));
/// ```
#[macro_export]
macro_rules! metrics {
    (
        $(#[$outer:meta])*
        $vis:vis struct $name:ident under $prefix:literal {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty = $init:expr $(=> $metric:literal, $help:literal)?;
            )*
        }
    ) => {
        $(#[$outer])*
        $vis struct $name {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )*
        }

        impl $name {
            /// Creates every metric, registers each one declared with a name under the
            /// prefix, and returns the prefixed registry for those that register
            /// themselves.
            pub fn registered(
                registry: &mut ::prometheus_client::registry::Registry,
            ) -> (Self, &mut ::prometheus_client::registry::Registry) {
                let metrics = $name {
                    $($field: $init,)*
                };
                let prefixed = registry.sub_registry_with_prefix($prefix);
                $($(
                    prefixed.register($metric, $help, metrics.$field.clone());
                )?)*
                (metrics, prefixed)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::Registry;

    crate::metrics! {
        /// Two metrics registered by the macro, one by hand.
        #[derive(Clone, Debug)]
        struct Two under "two" {
            /// A counter.
            count: Counter = Counter::default() => "count", "A counter";
            /// A gauge at 7.
            level: Gauge = { let g = Gauge::default(); g.set(7); g } => "level", "A gauge";
            /// Not registered by the macro.
            spare: Counter = Counter::default();
        }
    }

    fn text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn each_named_entry_is_registered_under_the_prefix_with_its_help_and_first_value() {
        let mut registry = Registry::default();
        let (metrics, _) = Two::registered(&mut registry);
        metrics.count.inc_by(3);
        let out = text(&registry);
        assert!(out.contains("# HELP two_count A counter."), "{out}");
        assert!(out.contains("two_count_total 3"), "{out}");
        assert!(out.contains("# HELP two_level A gauge."), "{out}");
        assert!(out.contains("two_level 7"), "{out}");
        assert!(!out.contains("spare"), "{out}");
    }

    #[test]
    fn an_entry_without_a_name_is_left_to_register_itself_under_the_prefix() {
        let mut registry = Registry::default();
        let (metrics, prefixed) = Two::registered(&mut registry);
        prefixed.register("spare", "By hand", metrics.spare.clone());
        metrics.spare.inc();
        assert!(text(&registry).contains("two_spare_total 1"));
    }
}
