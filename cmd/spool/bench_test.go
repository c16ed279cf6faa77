package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/spoolmq/spool/internal/bench"
	"github.com/spoolmq/spool/internal/storage"
)

// TestBenchArguments: the mode is required, -h is help, bad settings are refused before anything
// connects. (internal/bench runs real benches against an in-process broker.)
func TestBenchArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := benchMain(ctx, nil, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "Usage: spool bench <mode>") {
		t.Fatalf("no mode: %v, usage %q", err, errOut.String())
	}
	if err := benchMain(ctx, []string{"-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if err := benchMain(ctx, []string{"e2e", "-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("e2e -h: %v", err)
	}
	if err := benchMain(ctx, []string{"e2e", "extra"}, &out, &errOut); err == nil {
		t.Fatal("extra argument accepted")
	}
	if err := benchMain(ctx, []string{"e2e", "--size", "10"}, &out, &errOut); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("e2e --size 10: %v", err)
	}
	if err := benchMain(ctx, []string{"publish", "--rate", "5"}, &out, &errOut); err == nil {
		t.Fatal("publish accepted --rate, an e2e flag")
	}
}

func TestBenchFlagsConfig(t *testing.T) {
	t.Parallel()
	bf := newBenchFlags(bench.ModeE2E, &bytes.Buffer{})
	if err := bf.fs.Parse([]string{"--rate", "2000", "--groups", "16", "--consumers", "1", "--warmup", "0"}); err != nil {
		t.Fatal(err)
	}
	c := bf.config().WithDefaults()
	if c.Rate != 2000 || c.Groups != 16 || c.Consumers != 1 || c.Warmup != 0 || !c.Async || c.Duration != 30*time.Second || c.Size != 1024 {
		t.Fatalf("e2e config %+v", c)
	}
	bf = newBenchFlags(bench.ModePublish, &bytes.Buffer{})
	if err := bf.fs.Parse([]string{"--publishers", "10", "--clients", "1"}); err != nil {
		t.Fatal(err)
	}
	c = bf.config().WithDefaults()
	if c.Publishers != 10 || c.Clients != 1 || c.Async || c.Duration != 10*time.Second || c.Warmup != 2*time.Second {
		t.Fatalf("publish config %+v", c)
	}
}
