package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/admin"
	"github.com/spoolmq/spool/internal/broker"
	"github.com/spoolmq/spool/internal/cli"
)

// spool doctor answers the four troubleshooting questions of seed 004 (the PeeGeeQ user guide)
// from the admin API: one reading of the topic, its groups, /readyz and /api/v1/cleanup (two
// readings of the groups with --sample, for the lag's trend). Each answer is a verdict, the fix,
// and the evidence it rests on.

var doctorSpec = cmdSpec{
	name: "doctor",
	args: "[flags] <topic> [group]",
	desc: `Answers seed 004's troubleshooting questions for a topic (and one group, or every group):
  1. why is this group not receiving messages?
  2. why are messages not cleaned up?
  3. why is this group DEAD?
  4. why are writes blocked?
Each answer gives a verdict (OK, WARN or FAIL), what to do, and the evidence: state, members, last
heartbeat against the heartbeat timeout, lag (and its trend with --sample), pending, in flight,
dead-lettered, oldest unacked message, retention settings and what holds retention, cleanup jobs,
storage full, backpressure and damaged partitions. It reads the HTTP admin API only.`,
	examples: []string{
		"spool doctor orders.created billing",
		"spool doctor orders.created --sample 10s   # with the lag's trend",
	},
}

// doctorQuestions are seed 004's troubleshooting sections, in its order.
var doctorQuestions = [4]string{
	"Why is the group not receiving messages?",
	"Why are messages not cleaned up?",
	"Why is the group DEAD?",
	"Why are writes blocked?",
}

// doctorFacts is what doctor reads from the API.
type doctorFacts struct {
	topic   *admin.Topic
	groups  []admin.Group
	later   []admin.Group // a second reading (--sample), nil without
	ready   *admin.Status
	cleanup *admin.CleanupList
	now     time.Time
}

// finding is the answer to one question, for the topic or one group.
type finding struct {
	subject  string // "group billing", "topic orders"
	verdict  string // OK, WARN, FAIL
	why      string
	fix      string
	evidence []string
}

func runDoctor(ctx context.Context, e *cliEnv, args []string) error {
	fs := e.flagSet(doctorSpec)
	httpAddr := e.httpFlag(fs)
	sample := fs.Duration("sample", 0, "read the groups twice, this far apart, to show whether each lag grows (0: one reading)")
	pos, api, err := e.adminArgs(fs, httpAddr, args, 1, 2, "<topic>")
	if err != nil {
		return err
	}
	if *sample < 0 || *sample > time.Minute {
		return usagef(fs, "--sample must be 0 to 1m, got %s", *sample)
	}
	f := &doctorFacts{}
	if f.topic, err = api.Topic(ctx, pos[0]); err != nil {
		return err
	}
	if f.groups, err = api.TopicGroups(ctx, pos[0]); err != nil {
		return err
	}
	if len(pos) == 2 {
		name := cli.Group(pos[1])
		if !slices.ContainsFunc(f.groups, func(g admin.Group) bool { return g.Group == name }) {
			// Not a group of the topic: the API's answer (SUBSCRIPTION_NOT_FOUND) is the error.
			if _, err := api.Group(ctx, pos[0], pos[1]); err != nil {
				return err
			}
		}
	}
	if f.ready, err = api.Ready(ctx); err != nil {
		return err
	}
	if f.cleanup, err = api.Cleanup(ctx); err != nil {
		return err
	}
	if *sample > 0 {
		t := time.NewTimer(*sample)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if f.later, err = api.TopicGroups(ctx, pos[0]); err != nil {
			return err
		}
	}
	f.now = time.Now()
	return writeDoctor(e.stdout, f, cli.Group(argAt(pos, 1)), len(pos) == 2)
}

// writeDoctor prints the four answers; one says to answer for that group only.
func writeDoctor(w io.Writer, f *doctorFacts, group string, one bool) error {
	t := f.topic
	fmt.Fprintf(w, "Topic %s: %s, %d partitions, %d messages, %d groups; broker %s\n",
		t.Name, t.Config.Semantics, t.Config.Partitions, topicMessages(t), len(f.groups), readyText(f.ready))
	groups := f.groups
	if one {
		groups = slices.DeleteFunc(slices.Clone(groups), func(g admin.Group) bool { return g.Group != group })
	}
	answers := [4][]finding{}
	for _, g := range groups {
		answers[0] = append(answers[0], f.notReceiving(g))
		answers[2] = append(answers[2], f.dead(g))
	}
	if len(groups) == 0 {
		none := finding{subject: "topic " + t.Name, verdict: "WARN", why: "the topic has no consumer group: nothing receives its messages",
			fix: "subscribe a consumer (spool sub) or create a group (spool group create)"}
		answers[0], answers[2] = []finding{none}, []finding{{subject: "topic " + t.Name, verdict: "OK", why: "no group, none is DEAD"}}
	}
	answers[1] = []finding{f.notCleaned()}
	answers[3] = []finding{f.writesBlocked()}
	for i, q := range doctorQuestions {
		fmt.Fprintf(w, "\n%d. %s\n", i+1, q)
		for _, a := range answers[i] {
			fmt.Fprintf(w, "  [%s] %s: %s\n", a.verdict, a.subject, a.why)
			if a.fix != "" {
				fmt.Fprintf(w, "      fix: %s\n", a.fix)
			}
			for _, ev := range a.evidence {
				fmt.Fprintf(w, "      - %s\n", ev)
			}
		}
	}
	return nil
}

func topicMessages(t *admin.Topic) int64 {
	if t.Stats == nil {
		return 0
	}
	return t.Stats.Messages
}

func readyText(s *admin.Status) string {
	if s.Detail != "" {
		return s.Status + " (" + s.Detail + ")"
	}
	return s.Status
}

// damaged lists the topic's damaged partitions.
func (f *doctorFacts) damaged() []int32 {
	var out []int32
	if f.topic.Stats != nil {
		for _, p := range f.topic.Stats.Partitions {
			if p.Damaged {
				out = append(out, p.Partition)
			}
		}
	}
	return out
}

// groupEvidence is the evidence common to a group's answers.
func (f *doctorFacts) groupEvidence(g admin.Group) []string {
	ev := []string{
		fmt.Sprintf("state %s, health %s", g.State, g.Health),
		fmt.Sprintf("members on this broker: %d; last heartbeat %s ago, DEAD after %s without one",
			g.MemberCount, cli.Duration(f.now.Sub(g.LastHeartbeatAt).Round(time.Second)), cli.Duration(time.Duration(g.HeartbeatTimeout))),
		fmt.Sprintf("lag %d (never delivered)%s, pending %d, in flight %d, redelivering %d, dead-lettered %d",
			g.Lag, f.lagTrend(g), g.Pending, g.InFlight, g.Redelivering, g.DeadLettered),
	}
	if g.OldestUnackedAge != nil {
		ev = append(ev, "oldest unacked message "+cli.Duration(time.Duration(*g.OldestUnackedAge).Round(time.Second))+" old")
	}
	for _, r := range g.Reasons {
		ev = append(ev, "health: "+r)
	}
	return ev
}

// lagTrend compares a group's lag with the second reading.
func (f *doctorFacts) lagTrend(g admin.Group) string {
	for _, l := range f.later {
		if l.SubscriptionID == g.SubscriptionID {
			switch {
			case l.Lag > g.Lag:
				return fmt.Sprintf(", growing (%d later)", l.Lag)
			case l.Lag < g.Lag:
				return fmt.Sprintf(", shrinking (%d later)", l.Lag)
			}
			return ", steady"
		}
	}
	return ""
}

// notReceiving answers question 1 for a group (seed 004: PAUSED or CANCELLED, start position in
// the future, messages already processed; and what Spool adds: DEAD, no consumer, consumers at
// their in-flight bound, damaged partitions).
func (f *doctorFacts) notReceiving(g admin.Group) finding {
	a := finding{subject: "group " + g.Group, evidence: f.groupEvidence(g)}
	a.evidence = append(a.evidence, "start "+startDesc(g.Start))
	topic, name := f.topic.Name, g.Group
	switch g.State {
	case api.Paused:
		a.verdict, a.why, a.fix = "FAIL", "the group is PAUSED: it receives nothing until resumed", "spool group resume "+topic+" "+name
		return a
	case api.Cancelled:
		a.verdict, a.why, a.fix = "FAIL", "the group is CANCELLED (terminal)", "subscribe again: that creates a new subscription"
		return a
	case api.Dead:
		a.verdict, a.why = "FAIL", "the group is DEAD: no live consumer for its heartbeat timeout (see 3)"
		a.fix = "start a consumer (subscribing resurrects it) or spool group resurrect " + topic + " " + name
		return a
	}
	if d := f.damaged(); len(d) > 0 {
		a.verdict, a.why = "FAIL", fmt.Sprintf("partitions %v of the topic are damaged: their messages are not delivered", d)
		a.fix = "repair the partitions (docs/storage.md, damaged partitions)"
		return a
	}
	if g.Start.Kind == api.FromTimestamp && g.Start.Time.After(f.now) && g.Lag == 0 {
		a.verdict, a.why = "WARN", "the group starts at "+g.Start.Time.UTC().Format(time.RFC3339)+", in the future: earlier messages are not for it"
		a.fix = "spool group update " + topic + " " + name + " --from ... (only before it delivered anything), or wait"
		return a
	}
	if g.MemberCount == 0 {
		a.verdict, a.why = "FAIL", "no consumer is attached to the group on this broker"
		a.fix = "start a consumer of the group (spool sub " + topic + " --group " + name + ")"
		return a
	}
	full := 0
	for _, m := range g.Members {
		if m.MaxInFlight > 0 && m.InFlight >= m.MaxInFlight {
			full++
		}
	}
	if full == len(g.Members) && g.Lag > 0 {
		a.verdict, a.why = "WARN", "every consumer holds its max in-flight deliveries unacked: they get more only as they ack"
		a.fix = "check the consumers ack (or nack) what they process; raise max in-flight or add consumers"
		return a
	}
	if g.Pending == 0 {
		a.verdict, a.why = "OK", "nothing to receive: every message since the group's start is done (already processed"
		if g.DeadLettered > 0 {
			a.why += fmt.Sprintf(", or among the %d dead-lettered", g.DeadLettered)
		}
		a.why += ")"
		return a
	}
	a.verdict, a.why = "OK", "the group receives: it has consumers and messages to deliver"
	if g.Redelivering > 0 {
		a.why += fmt.Sprintf(" (%d wait for their redelivery backoff)", g.Redelivering)
	}
	return a
}

// dead answers question 3 for a group.
func (f *doctorFacts) dead(g admin.Group) finding {
	a := finding{subject: "group " + g.Group}
	ago := f.now.Sub(g.LastHeartbeatAt).Round(time.Second)
	timeout := time.Duration(g.HeartbeatTimeout)
	a.evidence = []string{fmt.Sprintf("last heartbeat %s (%s ago); heartbeat timeout %s; members on this broker: %d",
		g.LastHeartbeatAt.UTC().Format(time.RFC3339), cli.Duration(ago), cli.Duration(timeout), g.MemberCount)}
	switch {
	case g.State == api.Dead:
		a.verdict = "FAIL"
		a.why = fmt.Sprintf("no consumer of the group was attached to any broker for its heartbeat timeout (%s): the consumers crashed, stopped or cannot reach the broker", cli.Duration(timeout))
		a.fix = "restart the consumers (a consumer subscribing resurrects the group), or spool group resurrect " + f.topic.Name + " " + g.Group +
			"; if it is gone for good: spool group remove " + f.topic.Name + " " + g.Group
	case g.State == api.Active && g.MemberCount == 0:
		a.verdict = "WARN"
		left := max(timeout-ago, 0)
		a.why = fmt.Sprintf("not DEAD yet, but no consumer is attached here: DEAD in about %s unless one attaches (to this or another broker)", cli.Duration(left))
	default:
		a.verdict, a.why = "OK", "not DEAD (state "+string(g.State)+")"
	}
	return a
}

// holdsRetention says whether a group keeps messages from retention (seed 000: ACTIVE and PAUSED
// hold, DEAD and CANCELLED do not).
func holdsRetention(g admin.Group) bool {
	return g.State == api.Active || g.State == api.Paused
}

// notCleaned answers question 2 for the topic (seed 004: a group not completing messages, the
// cleanup job not running, the retention too long).
func (f *doctorFacts) notCleaned() finding {
	c := f.topic.Config
	a := finding{subject: "topic " + f.topic.Name}
	a.evidence = append(a.evidence, fmt.Sprintf("retention: completed messages kept message_retention %s; without a group zero_subscription_retention %s; everything removed after max_retention %s",
		cli.Duration(time.Duration(c.MessageRetention)), cli.Duration(time.Duration(c.ZeroSubscriptionRetention)), cli.Duration(time.Duration(c.MaxRetention))))
	var job *admin.CleanupJob
	for i := range f.cleanup.Jobs {
		if f.cleanup.Jobs[i].Job == broker.JobRetention {
			job = &f.cleanup.Jobs[i]
		}
	}
	if job != nil {
		ev := fmt.Sprintf("retention job: every %s, %d runs, %d failures, %d removed, backlog %d, last success %s",
			cli.Duration(time.Duration(job.Interval)), job.Runs, job.Failures, job.Removed, job.Backlog, since(job.LastSuccess))
		if job.LastError != "" {
			ev += ", last error: " + job.LastError
		}
		a.evidence = append(a.evidence, ev)
	}
	// The slowest group holding retention: the oldest unacked message.
	var slowest *admin.Group
	holding := 0
	for i, g := range f.groups {
		if !holdsRetention(g) || g.Pending == 0 {
			continue
		}
		holding++
		a.evidence = append(a.evidence, fmt.Sprintf("group %s (%s) holds %d messages%s", g.Group, g.State, g.Pending, oldestText(g)))
		if slowest == nil || age(g) > age(*slowest) {
			slowest = &f.groups[i]
		}
	}
	switch {
	case job == nil:
		a.verdict, a.why, a.fix = "FAIL", "the broker runs no retention job", "check the broker's retention_interval setting (a negative value disables it)"
	case job.Behind:
		a.verdict, a.why, a.fix = "FAIL", "the retention job falls behind: "+job.Reason, "look at the broker's log and spool_cleanup_job_* metrics"
	case job.Warning:
		a.verdict, a.why, a.fix = "WARN", "the retention job's backlog is high: "+job.Reason,
			"look at the broker's log for failed removals and at spool_cleanup_job_backlog"
	case slowest != nil:
		a.verdict = "WARN"
		a.why = fmt.Sprintf("%d group(s) have not completed messages; the slowest, %s, holds them%s (kept until max_retention %s)",
			holding, slowest.Group, oldestText(*slowest), cli.Duration(time.Duration(c.MaxRetention)))
		a.fix = "make the group consume; if it never will: spool group force-complete " + f.topic.Name + " " + slowest.Group +
			" --older-than <age>, or spool group remove / cancel"
		if slowest.Mode == "ordered" {
			// Force-complete refuses ORDERED groups: their acks are fenced by partition ownership.
			a.fix = "make the group consume; if it never will: spool group remove / cancel " + f.topic.Name + " " + slowest.Group
		}
	case !slices.ContainsFunc(f.groups, holdsRetention):
		a.verdict = "OK"
		a.why = "no group holds retention: messages are removed after zero_subscription_retention " + cli.Duration(time.Duration(c.ZeroSubscriptionRetention))
	default:
		a.verdict = "OK"
		a.why = "every group completed its messages: they are removed message_retention " + cli.Duration(time.Duration(c.MessageRetention)) + " after publishing"
	}
	return a
}

func age(g admin.Group) time.Duration {
	if g.OldestUnackedAge == nil {
		return 0
	}
	return time.Duration(*g.OldestUnackedAge)
}

func oldestText(g admin.Group) string {
	if g.OldestUnackedAge == nil {
		return ""
	}
	return ", oldest unacked " + cli.Duration(age(g).Round(time.Second)) + " old"
}

// writesBlocked answers question 4 for the topic (seed 004: no ACTIVE subscription with
// block_writes_on_zero_subscriptions; and what Spool adds: storage full, backpressure, damaged
// partitions).
func (f *doctorFacts) writesBlocked() finding {
	t := f.topic
	a := finding{subject: "topic " + t.Name}
	active := 0
	var states []string
	for _, g := range f.groups {
		if g.State == api.Active {
			active++
		}
		states = append(states, g.Group+" "+string(g.State))
	}
	a.evidence = append(a.evidence, fmt.Sprintf("block_writes_on_zero_subscriptions %t, ACTIVE groups %d of %d [%s]",
		t.Config.BlockWritesOnZeroSubscriptions, active, len(f.groups), strings.Join(states, ", ")))
	a.evidence = append(a.evidence, "broker "+readyText(f.ready))
	if bp := t.Backpressure; bp != nil {
		a.evidence = append(a.evidence, fmt.Sprintf("backpressure %s: backlog %d messages / %d bytes (bounds %d / %d), %d publishes throttled, %d rejected",
			bp.State, bp.BacklogMessages, bp.BacklogBytes, bp.MaxBacklogMessages, bp.MaxBacklogBytes, bp.Throttled, bp.Rejected))
	}
	d := f.damaged()
	switch {
	case strings.Contains(f.ready.Detail, "STORAGE_FULL"):
		a.verdict, a.why = "FAIL", "the storage is full: every publish is refused with STORAGE_FULL"
		a.fix = "free disk space or grow the volume; retention and cleanup free space as groups complete messages"
	case t.Config.Semantics == api.PubSub && t.Config.BlockWritesOnZeroSubscriptions && active == 0:
		a.verdict, a.why = "FAIL", "the topic blocks writes without an ACTIVE group (block_writes_on_zero_subscriptions): publishes fail with NO_SUBSCRIPTIONS"
		a.fix = "resume or resurrect a group, or create one (spool group create), or turn block_writes_on_zero_subscriptions off"
	case t.Backpressure != nil && t.Backpressure.State == broker.BackpressureRejecting:
		a.verdict, a.why = "FAIL", "the topic's backlog reached its bound: publishes are refused with RATE_LIMITED"
		a.fix = "let the groups catch up (see 1 and 2), raise max_backlog_messages / max_backlog_bytes, or remove groups that never consume"
	case t.Backpressure != nil && t.Backpressure.State == broker.BackpressureThrottled:
		a.verdict, a.why = "WARN", "the topic's backlog nears its bound: publishes are slowed down"
		a.fix = "let the groups catch up (see 1 and 2)"
	case len(d) > 0:
		a.verdict, a.why = "FAIL", fmt.Sprintf("partitions %v are damaged: publishes to them fail", d)
		a.fix = "repair the partitions (docs/storage.md)"
	case f.ready.Status != "ready":
		a.verdict, a.why = "FAIL", "the broker is not ready: "+f.ready.Detail
	default:
		a.verdict, a.why = "OK", "writes are not blocked"
	}
	return a
}

// startDesc describes a start position in one line.
func startDesc(s api.StartPosition) string {
	switch s.Kind {
	case api.FromTimestamp:
		return string(s.Kind) + " " + s.Time.UTC().Format(time.RFC3339)
	case api.FromMessageID:
		return fmt.Sprintf("%s %d:%d", s.Kind, s.Partition, s.Offset)
	case "":
		return string(api.FromNow)
	}
	return string(s.Kind)
}
