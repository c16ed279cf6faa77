package metrics

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
)

// deployDir is the ready-made operations files (alert rules, their tests, the Grafana dashboard).
const deployDir = "../../deploy"

// externalMetrics are the series deploy/ reads that Spool does not export: Prometheus' own up.
var externalMetrics = []string{"up"}

// nameRecorder is a Registerer that records the names of every metric registered through it.
type nameRecorder struct {
	*prometheus.Registry
	names map[string]bool
}

var fqNameRe = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *nameRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqNameRe.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registry.Register(c)
}

func (r *nameRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exportedNames returns the name of every metric Spool exports: the hook metrics and the broker
// collector's.
func exportedNames(t *testing.T) map[string]bool {
	rec := &nameRecorder{Registry: prometheus.NewRegistry(), names: map[string]bool{}}
	m := New(rec)
	if err := m.RegisterBroker(newBroker(t), CollectorOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterDiskSpace(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := m.RegisterWAL(func() WALStats { return WALStats{} }); err != nil {
		t.Fatal(err)
	}
	if len(rec.names) < 30 {
		t.Fatalf("recorded only %d metric names: %v", len(rec.names), rec.names)
	}
	return rec.names
}

// promqlNames returns the metric names an expression reads. It is a small tokenizer, not a
// parser: it drops strings, label matchers, ranges, grouping label lists and numbers, then takes every
// identifier that is not a function call, a keyword or a number.
func promqlNames(expr string) []string {
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`"(\\.|[^"\\])*"`),
		regexp.MustCompile(`\{[^}]*\}`),
		regexp.MustCompile(`\[[^\]]*\]`),
		regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`),
		regexp.MustCompile(`\b[0-9][0-9.]*(ms|[smhdwy])?\b`), // numbers and durations (offset 5m)
	} {
		expr = re.ReplaceAllString(expr, " ")
	}
	keywords := []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
		"group_left", "group_right", "inf", "nan"}
	var out []string
	for _, m := range regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`).FindAllString(expr, -1) {
		if strings.HasSuffix(m, "(") || slices.Contains(keywords, strings.ToLower(m)) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// deployExprs returns every PromQL expression of deploy/ by file: alert rule expressions, the
// metric names of the rule tests' input series, and the Grafana dashboard's queries and
// variable queries.
func deployExprs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	rules, err := filepath.Glob(filepath.Join(deployDir, "prometheus", "*.yml"))
	if err != nil || len(rules) < 2 {
		t.Fatalf("deploy/prometheus: %v %v", rules, err)
	}
	for _, f := range rules {
		var doc struct {
			Groups []struct {
				Rules []struct {
					Expr string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
			Tests []struct {
				InputSeries []struct {
					Series string `yaml:"series"`
				} `yaml:"input_series"`
			} `yaml:"tests"`
		}
		readYAML(t, f, &doc)
		for _, g := range doc.Groups {
			for _, r := range g.Rules {
				out[f] = append(out[f], r.Expr)
			}
		}
		for _, tc := range doc.Tests {
			for _, s := range tc.InputSeries {
				out[f] = append(out[f], s.Series)
			}
		}
	}
	dash := filepath.Join(deployDir, "grafana", "spool-dashboard.json")
	data, err := os.ReadFile(dash)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dash, err)
	}
	labelValues := regexp.MustCompile(`^label_values\(([A-Za-z_:][A-Za-z0-9_:]*),`)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out[dash] = append(out[dash], tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			out[dash] = append(out[dash], m[1])
		}
	}
	return out
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// TestDeployMetricNames: every metric that the alert rules, their tests and the Grafana dashboard
// in deploy/ read is one Spool exports (a histogram's _bucket, _sum and _count series included)
// or one of the few external series they are documented to need, so a renamed metric cannot
// leave a rule or a panel silently empty.
func TestDeployMetricNames(t *testing.T) {
	t.Parallel()
	known := exportedNames(t)
	exists := func(name string) bool {
		if known[name] || slices.Contains(externalMetrics, name) {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && known[base] {
				return true
			}
		}
		return false
	}
	used := map[string]bool{}
	for file, exprs := range deployExprs(t) {
		if len(exprs) == 0 {
			t.Errorf("%s: no expressions found", file)
		}
		for _, e := range exprs {
			names := promqlNames(e)
			if len(names) == 0 {
				t.Errorf("%s: no metric in %q", file, e)
			}
			for _, n := range names {
				used[n] = true
				if !exists(n) {
					t.Errorf("%s: %q reads %s, which Spool does not export", file, e, n)
				}
			}
		}
	}
	// The tokenizer finds what it must: a few names the files are known to read.
	for _, n := range []string{"consumer_lag", "spool_subscription_state", "spool_cleanup_job_failures_total",
		"spool_publish_duration_seconds_bucket", "spool_partition_damaged", "up"} {
		if !used[n] {
			t.Errorf("no expression of deploy/ reads %s", n)
		}
	}
}

// TestPromqlNames pins the tokenizer TestDeployMetricNames relies on.
func TestPromqlNames(t *testing.T) {
	t.Parallel()
	got := promqlNames(`histogram_quantile(0.99, sum by (le, topic) (rate(spool_x_bucket{a="b}",c=~"$t"}[$__rate_interval])))
		and on (topic) max by (topic)(foo:bar) > 0 unless bool up offset 5m or vector(0)`)
	if want := []string{"spool_x_bucket", "foo:bar", "up"}; !slices.Equal(got, want) {
		t.Fatalf("promqlNames = %q, want %q", got, want)
	}
}

// TestDeployDashboardQueries: every query of the Grafana dashboard is valid PromQL, checked by
// promtool as a recording rule (Grafana's $variables replaced by values). promtool is installed
// by scripts/test.sh, which sets SPOOL_TEST_REQUIRE_PROMTOOL=1; elsewhere the test skips without it.
func TestDeployDashboardQueries(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("SPOOL_TEST_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not found and SPOOL_TEST_REQUIRE_PROMTOOL is set")
		}
		t.Skip("promtool not found (Debian package prometheus)")
	}
	dash := filepath.Join(deployDir, "grafana", "spool-dashboard.json")
	vars := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$topic", ".*")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for _, e := range deployExprs(t)[dash] {
		if strings.Contains(e, "(") || strings.Contains(e, "{") {
			rules = append(rules, rule{Record: "spool:dashboard_query", Expr: vars.Replace(e)})
		}
	}
	doc := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	data, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules of the dashboard's %d queries: %v\n%s", len(rules), err, out)
	}
}
