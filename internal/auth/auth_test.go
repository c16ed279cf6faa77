package auth

import (
	"strings"
	"testing"

	"github.com/spoolmq/spool/internal/names"
)

const tokenA = "0123456789abcdef-alice"

func TestHashToken(t *testing.T) {
	h1, err := HashToken(tokenA)
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := HashToken(tokenA)
	if h1 == h2 {
		t.Errorf("two hashes of one token are equal (%s): the salt is missing", h1)
	}
	if !strings.HasPrefix(h1, "sha256:") || !CheckToken(h1, tokenA) || !CheckToken(h2, tokenA) {
		t.Errorf("hash %s does not check its token", h1)
	}
	if CheckToken(h1, tokenA+"x") || CheckToken(h1, "") || CheckToken("garbage", tokenA) {
		t.Error("a wrong token or hash checks")
	}
	if _, err := HashToken("short"); err == nil {
		t.Error("a 5-character token was hashed")
	}
}

func testConfig(t *testing.T) Config {
	t.Helper()
	h, err := HashToken(tokenA)
	if err != nil {
		t.Fatal(err)
	}
	return Config{Principals: []Principal{
		{Name: "alice", TokenHash: h, Permissions: []Permission{
			{Action: Publish, Topics: "orders.#"},
			{Action: Consume, Topics: "orders.*", Groups: "billing-*"},
		}},
		{Name: "ops", CertCN: "ops.example", Permissions: []Permission{{Action: Admin, Topics: "#"}, {Action: Priority, Topics: "alerts.#"}}},
	}}
}

// The priority permission (backpressure exemption) is its own action on topic patterns.
func TestPriorityPermission(t *testing.T) {
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ops, _ := a.ByCertCN("ops.example")
	alice, _ := a.ByCertCN("")
	if !ops.Can(Priority, "alerts.disk") || ops.Can(Priority, "orders.x") || alice.Can(Priority, "alerts.disk") {
		t.Fatal("priority granted where not configured, or not granted where configured")
	}
}

func TestAuthorizer(t *testing.T) {
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	alice, ok := a.ByToken(tokenA)
	if !ok || alice.Name != "alice" {
		t.Fatalf("ByToken(good) = %v, %v", alice, ok)
	}
	for _, tok := range []string{"", "0123456789abcdef-bob"} {
		if p, ok := a.ByToken(tok); ok {
			t.Errorf("ByToken(%q) = %s", tok, p.Name)
		}
	}
	ops, ok := a.ByCertCN("ops.example")
	if !ok || ops.Name != "ops" {
		t.Fatalf("ByCertCN = %v, %v", ops, ok)
	}
	if _, ok := a.ByCertCN(""); ok {
		t.Error("empty CN names a principal")
	}
	checks := []struct {
		name string
		got  bool
		want bool
	}{
		{"publish orders.eu.new", alice.Can(Publish, "orders.eu.new"), true},
		{"publish orders", alice.Can(Publish, "orders"), true},
		{"publish billing.x", alice.Can(Publish, "billing.x"), false},
		{"admin orders.x", alice.Can(Admin, "orders.x"), false},
		{"consume orders.x billing-1", alice.CanConsume("orders.x", "billing-1"), true},
		{"consume orders.x other", alice.CanConsume("orders.x", "other"), false},
		{"consume orders.x no group", alice.CanConsume("orders.x", ""), false},
		{"consume orders.a.b", alice.CanConsume("orders.a.b", "billing-1"), false},
		{"group billing-2", alice.MayConsumeGroup("billing-2"), true},
		{"group x", alice.MayConsumeGroup("x"), false},
		{"alice admin all", alice.CanAdminAll(), false},
		{"ops admin all", ops.CanAdminAll(), true},
		{"ops admin x", ops.Can(Admin, "x"), true},
		{"ops publish x", ops.Can(Publish, "x"), false},
		{"nil principal", (*Principal)(nil).Can(Publish, "x"), false},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if off, err := New(Config{}); off != nil || err != nil || off.Enabled() || !off.OpenMetrics() {
		t.Errorf("New(no principals) = %v, %v: want nil (off)", off, err)
	}
}

func TestGroupMatch(t *testing.T) {
	for _, c := range []struct {
		glob, group string
		want        bool
	}{
		{"", "", true}, {"", "g", true}, {"g", "g", true}, {"g", "h", false},
		{"billing-*", "billing-", true}, {"billing-*", "billing-eu", true}, {"billing-*", "billing", false},
		{"*-eu", "x-eu", true}, {"a*b*c", "aXbYc", true}, {"a*b*c", "acb", false}, {"a*a", "a", false},
	} {
		if got := groupMatch(c.glob, c.group); got != c.want {
			t.Errorf("groupMatch(%q, %q) = %v, want %v", c.glob, c.group, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := testConfig(t)
	if key, err := good.Validate(); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	for _, c := range []struct {
		key    string
		change func(*Config)
	}{
		{"principals[0].name", func(c *Config) { c.Principals[0].Name = "" }},
		{"principals[1].name", func(c *Config) { c.Principals[1].Name = "alice" }},
		{"principals[1]", func(c *Config) { c.Principals[1].CertCN = "" }},
		{"principals[0].token_hash", func(c *Config) { c.Principals[0].TokenHash = "plain-token" }},
		{"principals[0].permissions[0].action", func(c *Config) { c.Principals[0].Permissions[0].Action = "write" }},
		{"principals[0].permissions[0].topics", func(c *Config) { c.Principals[0].Permissions[0].Topics = "a.#.b" }},
		{"principals[0].permissions[0].groups", func(c *Config) { c.Principals[0].Permissions[0].Groups = "g" }},
	} {
		cfg := testConfig(t)
		c.change(&cfg)
		if key, err := cfg.Validate(); key != c.key || err == nil {
			t.Errorf("want an error at %s, got %q: %v", c.key, key, err)
		}
		if a, err := New(cfg); a != nil || err == nil {
			t.Errorf("New accepted an invalid config (%s)", c.key)
		}
	}
}

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		perm, pattern string
		want          bool
	}{
		{"#", "#", true}, {"#", "a.*.b", true}, {"orders.#", "orders.#", true}, {"orders.#", "orders", true},
		{"orders.#", "orders.*", true}, {"orders.#", "orders.eu.#", true}, {"orders.#", "#", false},
		{"orders.#", "billing.*", false}, {"orders.*", "orders.*", true}, {"orders.*", "orders.eu", true},
		{"orders.*", "orders.#", false}, {"orders.*", "orders.*.x", false}, {"orders.*", "orders", false},
		{"orders.eu", "orders.*", false}, {"orders.eu", "orders.eu", true}, {"*.eu", "orders.eu", true},
		{"*.eu", "*.eu", true}, {"*.eu", "*.*", false}, {"a.*.#", "a.b", true}, {"a.*.#", "a", false}, {"a.*.#", "a.b.c.d", true},
	} {
		if got := Covers(c.perm, c.pattern); got != c.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", c.perm, c.pattern, got, c.want)
		}
	}
}

// TestCoversAgreesWithMatch: over every pattern and topic of up to 3 segments of {a, b, *, #},
// Covers(q, p) holds exactly when every topic p matches (up to 4 segments of {a, b, c}) also
// matches q.
func TestCoversAgreesWithMatch(t *testing.T) {
	var patterns, topics []string
	var gen func(prefix string, n int, segs []string, out *[]string)
	gen = func(prefix string, n int, segs []string, out *[]string) {
		if n == 0 {
			return
		}
		for _, s := range segs {
			p := s
			if prefix != "" {
				p = prefix + "." + s
			}
			if names.ValidatePattern(p) == nil {
				*out = append(*out, p)
			}
			if s != "#" {
				gen(p, n-1, segs, out)
			}
		}
	}
	gen("", 3, []string{"a", "b", "*", "#"}, &patterns)
	gen("", 4, []string{"a", "b", "c"}, &topics)
	for _, q := range patterns {
		for _, p := range patterns {
			want := true
			for _, topic := range topics {
				if names.Match(p, topic) && !names.Match(q, topic) {
					want = false
					break
				}
			}
			if got := Covers(q, p); got != want {
				t.Errorf("Covers(%q, %q) = %v, want %v", q, p, got, want)
			}
		}
	}
}
