package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spoolmq/spool/client"
	"github.com/spoolmq/spool/internal/cli"
)

// Limits of spool pub.
const (
	// maxStdinLine bounds one line read from stdin: the broker's 10 MiB max frame (a message is
	// further bounded by its topic's max_message_bytes, 1 MiB by default).
	maxStdinLine = 10 << 20
	// maxPubErrorLines bounds the failures printed one by one; the summary counts the others.
	maxPubErrorLines = 10
	// countPlaceholder in a payload argument is replaced by the message's number (1, 2, ...).
	countPlaceholder = "{{n}}"
)

var pubSpec = cmdSpec{
	name: "pub",
	args: "[flags] <topic> [payload ...]",
	desc: `Publishes messages over the binary protocol and prints the id of each (the offset on a
one-partition topic, partition:offset otherwise, as everywhere), in input order. Each payload
argument is one message; --count repeats them, and "{{n}}" in a payload becomes the message's
number (1, 2, ...). --file publishes a file's contents as one message ("-":
all of stdin). Without payloads or --file, every line of stdin is one message (empty lines
included), published asynchronously in pipelined batches; with stderr on a terminal a count is
shown every second. A summary goes to stderr after stdin lines, or when more than one message was published. Every
message is acknowledged durably by the broker before its id is printed. With --producer-id, the
broker stores a message only once per producer id within the topic's dedup_window (default 2 min):
a repeat is answered with the first message's id, marked "(duplicate)", and the client may safely
retry a publish whose outcome it did not learn. --delay holds each message back from delivery
for that long after the broker receives it, --ttl drops it undelivered once it is that old; both
count on the broker's clock.`,
	examples: []string{
		`spool pub orders.created 'hello world'`,
		`spool pub --key user-7 --header trace=abc orders.created '{"id":1}'`,
		`spool pub --count 1000 --quiet orders.created 'order {{n}}'`,
		`spool pub --file invoice.pdf invoices`,
		`spool pub --producer-id order-1001 orders.created '{"id":1001}'`,
		`spool pub --delay 30s --ttl 1h reminders 'call back'`,
		`spool pub --count 100 --producer-id 'import-7-{{n}}' orders.created 'row {{n}}'`,
		`seq 100000 | spool pub orders.created`,
	},
}

// pubOptions are the parsed flags and arguments of spool pub.
type pubOptions struct {
	addr      string
	topic     string
	payloads  []string
	file      string
	count     int
	key       string
	producer  string
	headers   map[string]string
	partition int
	ttl       time.Duration
	delay     time.Duration
	json      bool
	quiet     bool
}

func runPub(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(pubSpec)
	addr := e.addrFlag(fs)
	o := pubOptions{headers: map[string]string{}}
	fs.StringVar(&o.key, "key", "", "message key: routes the message to partition hash(key) mod partitions")
	fs.Func("header", "message header `k=v` (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want k=v, got %q", s)
		}
		o.headers[k] = v
		return nil
	})
	fs.StringVar(&o.producer, "producer-id", "", "producer id of each message, for de-duplication by the broker; \"{{n}}\" becomes the message's number")
	fs.IntVar(&o.partition, "partition", -1, "publish to this partition; -1: by key, else the broker chooses")
	fs.DurationVar(&o.ttl, "ttl", 0, "drop each message undelivered once it is older than this (broker clock); 0: never")
	fs.DurationVar(&o.delay, "delay", 0, "deliver each message no earlier than this long after the broker receives it (counted on the broker's clock)")
	fs.IntVar(&o.count, "count", 1, "publish each payload argument (or --file) this many times")
	fs.StringVar(&o.file, "file", "", "publish the contents of this file as one message (\"-\": all of stdin)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per message instead of its id")
	fs.BoolVar(&o.quiet, "quiet", false, "print no ids, only the summary")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, pos, 1, -1, "<topic>"); err != nil {
		return err
	}
	o.addr, o.topic, o.payloads = *addr, pos[0], pos[1:]
	switch {
	case o.file != "" && len(o.payloads) > 0:
		return usagef(fs, "pub: give payload arguments or --file, not both")
	case o.count < 1:
		return usagef(fs, "pub: --count must be at least 1, got %d", o.count)
	case o.count > 1 && o.file == "" && len(o.payloads) == 0:
		return usagef(fs, "pub: --count repeats payload arguments or --file; stdin lines are published once each")
	case o.partition < -1 || o.partition > 1<<31-1:
		return usagef(fs, "pub: --partition must be a partition number, got %d", o.partition)
	case o.json && o.quiet:
		return usagef(fs, "pub: give --json or --quiet, not both")
	case o.ttl < 0 || o.delay < 0:
		return usagef(fs, "pub: --ttl and --delay must not be negative")
	}

	var src messageSource
	switch {
	case o.file != "":
		data, err := readPubFile(e, o.file)
		if err != nil {
			return err
		}
		src = repeatSource([]string{string(data)}, o.count, false)
	case len(o.payloads) > 0:
		src = repeatSource(o.payloads, o.count, true)
	default:
		src = newLineSource(e.stdin)
	}

	c, err := e.dial(ctx, o.addr, "pub")
	if err != nil {
		return err
	}
	p := &publisher{e: e, o: &o, c: c, start: time.Now(), results: map[int]pubResult{}, next: 1}
	if r, ok := src.(*repeat); ok && r.total == 1 {
		p.single = true
	}
	if o.json {
		p.jsonOut = cli.NewJSONLines(e.stdout)
	}
	runErr := p.run(ctx, src)
	cctx, cancel := closeCtx(ctx)
	defer cancel()
	flushErr := c.Flush(cctx)
	closeErr := c.Close(cctx)
	p.finish(ctx.Err() != nil)
	switch {
	case runErr != nil:
		return runErr
	case p.firstErr != nil:
		return p.firstErr
	case flushErr != nil:
		return fmt.Errorf("waiting for the broker's acknowledgements: %w", flushErr)
	case closeErr != nil:
		return fmt.Errorf("closing the connection: %w", closeErr)
	}
	return nil
}

// readPubFile reads the payload of --file ("-": stdin).
func readPubFile(e *cliEnv, name string) ([]byte, error) {
	if name == "-" {
		data, err := io.ReadAll(io.LimitReader(e.stdin, maxStdinLine+1))
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		if len(data) > maxStdinLine {
			return nil, fmt.Errorf("stdin holds more than %d bytes, the most one message may have", maxStdinLine)
		}
		return data, nil
	}
	fi, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxStdinLine {
		return nil, fmt.Errorf("%s is %d bytes; one message holds at most %d", name, fi.Size(), maxStdinLine)
	}
	return os.ReadFile(name)
}

// messageSource yields payloads: ok false at the end; err for a read failure.
type messageSource interface {
	next(ctx context.Context) (payload []byte, ok bool, err error)
	// streaming reports a source of unknown length (stdin lines): progress and summary are shown.
	streaming() bool
}

// repeatSource yields payloads count times in order; with template, "{{n}}" becomes the message's
// number.
func repeatSource(payloads []string, count int, template bool) messageSource {
	return &repeat{payloads: payloads, total: count * len(payloads), template: template}
}

type repeat struct {
	payloads []string
	total, n int
	template bool
}

func (r *repeat) next(context.Context) ([]byte, bool, error) {
	if r.n >= r.total {
		return nil, false, nil
	}
	p := r.payloads[r.n%len(r.payloads)]
	r.n++
	if r.template {
		p = strings.ReplaceAll(p, countPlaceholder, strconv.Itoa(r.n))
	}
	return []byte(p), true, nil
}

func (r *repeat) streaming() bool { return false }

// lineSource reads lines on its own goroutine, so that a SIGINT is noticed while stdin blocks (the
// goroutine then stays blocked in its read until the process exits).
type lineSource struct {
	lines chan []byte
	err   chan error
}

func newLineSource(r io.Reader) *lineSource {
	s := &lineSource{lines: make(chan []byte, 256), err: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), maxStdinLine)
		n := 0
		for sc.Scan() {
			n++
			s.lines <- append([]byte(nil), sc.Bytes()...)
		}
		if err := sc.Err(); err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				err = fmt.Errorf("stdin line %d is longer than %d bytes, the most one message may have", n+1, maxStdinLine)
			} else {
				err = fmt.Errorf("read stdin: %w", err)
			}
			s.err <- err
		}
		close(s.lines)
	}()
	return s
}

func (s *lineSource) next(ctx context.Context) ([]byte, bool, error) {
	select {
	case <-ctx.Done():
		return nil, false, nil
	case line, ok := <-s.lines:
		if ok {
			return line, true, nil
		}
		select {
		case err := <-s.err:
			return nil, false, err
		default:
			return nil, false, nil
		}
	}
}

func (s *lineSource) streaming() bool { return true }

// pubResult is the outcome of one message.
type pubResult struct {
	pos client.Position
	err error
}

// publisher publishes a source's messages with PublishAsync and prints their outcomes in input
// order: callbacks arrive in completion order, so results wait in a map (at most the client's
// async window) until the ones before them are printed.
type publisher struct {
	e       *cliEnv
	o       *pubOptions
	c       *brokerClient
	jsonOut *cli.JSONLines
	start   time.Time
	// sent is written by run only.
	sent      int
	streaming bool
	// single says the source is one message: its outcome is the command's output and exit status,
	// without per-message error lines or summary.
	single bool

	mu sync.Mutex
	// results hold outcomes that arrived before an earlier message's; next is the number of the
	// next message to print.
	results   map[int]pubResult
	next      int
	published int
	failed    int
	firstErr  error
	// progressShown says a progress line is on the terminal (the next output clears it).
	progressShown bool
}

// pubJSON is the --json line of a published message.
type pubJSON struct {
	Seq         int       `json:"seq"`
	Topic       string    `json:"topic"`
	ID          string    `json:"id"`
	Partition   int32     `json:"partition"`
	Offset      int64     `json:"offset"`
	PublishedAt time.Time `json:"published_at"`
	Duplicate   bool      `json:"duplicate,omitempty"`
}

// run publishes until the source ends, ctx ends (SIGINT) or a publish failed.
func (p *publisher) run(ctx context.Context, src messageSource) error {
	p.streaming = src.streaming()
	var tick <-chan time.Time
	if p.streaming && p.e.stderrTTY {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			p.progress()
		default:
		}
		if p.failures() > 0 || ctx.Err() != nil {
			return nil
		}
		payload, ok, err := src.next(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		p.sent++
		seq := p.sent
		p.c.PublishAsync(p.o.topic, p.message(payload, seq), func(pos client.Position, err error) {
			p.done(seq, pubResult{pos: pos, err: err})
		})
	}
}

func (p *publisher) message(payload []byte, seq int) client.Message {
	m := client.Message{Payload: payload}
	if p.o.producer != "" {
		m.ProducerID = strings.ReplaceAll(p.o.producer, countPlaceholder, strconv.Itoa(seq))
	}
	if p.o.key != "" {
		m.Key = []byte(p.o.key)
	}
	if len(p.o.headers) > 0 {
		m.Headers = p.o.headers // the client only reads them
	}
	if p.o.partition >= 0 {
		m.PinPartition, m.Partition = true, int32(p.o.partition)
	}
	m.TTL = p.o.ttl
	m.Delay = p.o.delay // counted by the broker, on its clock (an older broker: on this machine's)
	return m
}

func (p *publisher) failures() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// done records the outcome of message seq and prints every outcome that is now in order. It runs
// on the client's callback goroutine; writing to a full stdout pipe blocks it, which stops the
// async window from refilling: backpressure, no unbounded buffer.
func (p *publisher) done(seq int, r pubResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.results[seq] = r
	for {
		r, ok := p.results[p.next]
		if !ok {
			return
		}
		delete(p.results, p.next)
		p.printLocked(p.next, r)
		p.next++
	}
}

// printLocked prints one outcome. p.mu must be held.
func (p *publisher) printLocked(seq int, r pubResult) {
	if r.err != nil {
		p.failed++
		if p.firstErr == nil {
			p.firstErr = r.err
		}
		if !p.single && p.failed <= maxPubErrorLines {
			p.clearProgressLocked()
			fmt.Fprintf(p.e.stderr, "spool: message %d not published: %s\n", seq, errorText(r.err))
		}
		return
	}
	p.published++
	switch {
	case p.jsonOut != nil:
		_ = p.jsonOut.Write(pubJSON{Seq: seq, Topic: p.o.topic, ID: r.pos.MessageID(), Partition: r.pos.Partition,
			Offset: r.pos.Offset, PublishedAt: r.pos.PublishTime, Duplicate: r.pos.Duplicate})
	case !p.o.quiet:
		dup := ""
		if r.pos.Duplicate {
			dup = " (duplicate)"
		}
		fmt.Fprintf(p.e.stdout, "%s%s\n", r.pos.MessageID(), dup)
	}
}

// progress shows the count so far on the terminal, on one line rewritten every second.
func (p *publisher) progress() {
	p.mu.Lock()
	defer p.mu.Unlock()
	el := time.Since(p.start).Seconds()
	fmt.Fprintf(p.e.stderr, "\r\x1b[Kpublished %d messages (%.0f msg/s)", p.published, float64(p.published)/el)
	p.progressShown = true
}

// clearProgressLocked erases the progress line. p.mu must be held.
func (p *publisher) clearProgressLocked() {
	if p.progressShown {
		fmt.Fprint(p.e.stderr, "\r\x1b[K")
		p.progressShown = false
	}
}

// finish prints the summary on stderr (after Flush: every outcome is in).
func (p *publisher) finish(interrupted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearProgressLocked()
	if p.single || !p.streaming && p.sent <= 1 {
		return
	}
	el := time.Since(p.start)
	var b strings.Builder
	fmt.Fprintf(&b, "published %d message%s to %s in %s (%.0f msg/s)", p.published, pluralS(p.published), p.o.topic,
		el.Round(time.Millisecond), float64(p.published)/max(el.Seconds(), 1e-9))
	if p.failed > 0 {
		fmt.Fprintf(&b, "; %d failed", p.failed)
	}
	if missing := p.sent - p.published - p.failed; missing > 0 {
		fmt.Fprintf(&b, "; %d without an answer", missing)
	}
	if interrupted {
		b.WriteString("; interrupted")
	}
	fmt.Fprintln(p.e.stderr, b.String())
}

func pluralS(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
