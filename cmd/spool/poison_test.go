package main

import (
	"flag"
	"reflect"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/storage"
)

// TestPoisonFlags: the poison-rule flags given are sent inside poison_rules (the server merges
// them into the topic's rules), the others not at all.
func TestPoisonFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg := addTopicConfigFlags(fs, false)
	if _, err := parseArgs(fs, []string{"--poison-same-reason", "--poison-max-failures", "3", "--ack-wait", "10s"}); err != nil {
		t.Fatal(err)
	}
	body, err := cfg.body(fs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"ack_wait": "10s", "poison_rules": map[string]any{"distinct_members": true, "max_failures": 3}}
	if !reflect.DeepEqual(body, want) {
		t.Fatalf("body %v, want %v", body, want)
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	cfg = addTopicConfigFlags(fs, false)
	if _, err := parseArgs(fs, []string{"--poison-window", "1m"}); err != nil {
		t.Fatal(err)
	}
	if body, _ = cfg.body(fs); !reflect.DeepEqual(body, map[string]any{"poison_rules": map[string]any{"window": "1m0s"}}) {
		t.Fatalf("body %v", body)
	}
	if got := poisonText(nil); got != "off" {
		t.Errorf("poisonText(nil) = %q", got)
	}
	if got := poisonText(&admin.PoisonRules{DistinctMembers: true, MaxFailures: 3, Window: admin.Duration(30 * time.Second)}); got != "same nack reason from several members; 3 failures within 30s" {
		t.Errorf("poisonText = %q", got)
	}
	if got := failuresText([]storage.DeliveryFailure{{Member: "a", Reason: "bad"}, {Member: "b", Reason: "bad"}}); got != "a: bad, b: bad" {
		t.Errorf("failuresText = %q", got)
	}
}

// TestCLIPoisonWindowAlone: --poison-window without --poison-max-failures (on a topic without
// max_failures) fails with the server's error instead of storing nothing.
func TestCLIPoisonWindowAlone(t *testing.T) {
	t.Parallel()
	s := startCLIStack(t)
	const want = "poison_rules.window needs poison_rules.max_failures"
	s.fails(t, 1, want, "topic", "create", "jobs", "--poison-window", "1m")
	s.ok(t, "", "topic", "create", "jobs")
	s.fails(t, 1, want, "topic", "update", "jobs", "--poison-window", "1m")
	s.ok(t, "", "topic", "update", "jobs", "--poison-max-failures", "3", "--poison-window", "1m")
}
