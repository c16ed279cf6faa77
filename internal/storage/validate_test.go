package storage

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStartNormalize(t *testing.T) {
	sp, err := StartPosition{}.Normalize()
	if err != nil || sp.Kind != FromNow {
		t.Fatalf("zero start: %+v, %v; want FROM_NOW", sp, err)
	}
	for _, bad := range []StartPosition{
		{Kind: "FROM_YESTERDAY"},
		{Kind: FromMessageID, Partition: -1},
		{Kind: FromMessageID, Offset: -5},
	} {
		if _, err := bad.Normalize(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", bad, err)
		}
	}
	ok := StartPosition{Kind: FromMessageID, Partition: 2, Offset: 7}
	if got, err := ok.Normalize(); err != nil || got != ok {
		t.Errorf("%+v: %+v, %v", ok, got, err)
	}
}

func TestCheckTopic(t *testing.T) {
	cfg, err := CheckTopic("orders.created", TopicConfig{})
	if err != nil || cfg != (TopicConfig{}).WithDefaults() {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	if _, err := CheckTopic("orders..created", TopicConfig{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad name: %v, want ErrInvalidArgument", err)
	}
	if _, err := CheckTopic("orders", TopicConfig{Partitions: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad config: %v, want ErrInvalidArgument", err)
	}
}

func TestSubscriptionCreateParamsCheck(t *testing.T) {
	var nilParams *SubscriptionCreateParams
	if _, err := nilParams.Check(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil params: %v", err)
	}
	good := &SubscriptionCreateParams{Topic: "a.b", Group: "g-1", Pattern: "a.*"}
	if sp, err := good.Check(); err != nil || sp.Kind != FromNow {
		t.Fatalf("good params: %+v, %v", sp, err)
	}
	if _, err := (&SubscriptionCreateParams{Topic: "a", Group: QueueGroup}).Check(); err != nil {
		t.Errorf("the queue group is accepted: %v", err)
	}
	for _, bad := range []*SubscriptionCreateParams{
		{Topic: ""},
		{Topic: "a", Group: "bad group"},
		{Topic: "a", Pattern: "a.#.b.#"},
		{Topic: "a", Start: StartPosition{Kind: "NEVER"}},
	} {
		if _, err := bad.Check(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestUnbuiltSettingsRefused: an unknown completion_tracking is refused with INVALID_ARGUMENT
// (not ErrNotImplemented: every setting is built); the defaults, spelled out or left zero, and
// refcount are accepted.
func TestUnbuiltSettingsRefused(t *testing.T) {
	for name, cfg := range map[string]TopicConfig{
		"unknown tracking": {CompletionTracking: "exactly-once"},
	} {
		_, err := CheckTopic("t", cfg)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
		if want := name != "unknown tracking"; errors.Is(err, ErrNotImplemented) != want {
			t.Errorf("%s: %v: ErrNotImplemented %v, want %v", name, err, !want, want)
		}
		if want := name != "unknown tracking"; want && err != nil && !strings.Contains(err.Error(), "not implemented yet") {
			t.Errorf("%s: %q does not say it is not implemented", name, err)
		}
	}
	for name, cfg := range map[string]TopicConfig{
		"zero":              {},
		"spelled defaults":  {CompletionTracking: Watermark, ZombieTTL: DefaultZombieTTL},
		"watermark, no ttl": {CompletionTracking: Watermark},
		"refcount":          {CompletionTracking: Refcount},
	} {
		if _, err := CheckTopic("t", cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestZombieTTL: zombie_ttl is at least 1s, and an explicit value above max_retention is refused
// (it could never fire); the default is accepted whatever max_retention is.
func TestZombieTTL(t *testing.T) {
	for name, cfg := range map[string]TopicConfig{
		"1s":                 {ZombieTTL: time.Second},
		"3 d":                {ZombieTTL: 72 * time.Hour},
		"= max_retention":    {ZombieTTL: 48 * time.Hour, MaxRetention: 48 * time.Hour},
		"default, short cap": {MaxRetention: time.Hour, MessageRetention: time.Minute},
	} {
		if _, err := CheckTopic("t", cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, cfg := range map[string]TopicConfig{
		"999ms":           {ZombieTTL: 999 * time.Millisecond},
		"negative":        {ZombieTTL: -time.Hour},
		"> max_retention": {ZombieTTL: 49 * time.Hour, MaxRetention: 48 * time.Hour},
	} {
		_, err := CheckTopic("t", cfg)
		if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrNotImplemented) || err == nil || !strings.Contains(err.Error(), "zombie_ttl") {
			t.Errorf("%s: %v, want ErrInvalidArgument naming zombie_ttl", name, err)
		}
	}
}

// TestSizeBounds: max_messages and max_bytes are 0 (no bound) or positive, size_policy is
// keep_needed (also empty) or drop_oldest; OverSize compares with the bounds that are set.
func TestSizeBounds(t *testing.T) {
	for name, cfg := range map[string]TopicConfig{
		"none":        {},
		"messages":    {MaxMessages: 10},
		"bytes":       {MaxBytes: 1 << 20, SizePolicy: SizeKeepNeeded},
		"drop_oldest": {MaxMessages: 1, MaxBytes: 1, SizePolicy: SizeDropOldest},
	} {
		if _, err := CheckTopic("t", cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, cfg := range map[string]TopicConfig{
		"max_messages": {MaxMessages: -1},
		"max_bytes":    {MaxBytes: -5},
		"size_policy":  {MaxBytes: 10, SizePolicy: "newest"},
	} {
		if _, err := CheckTopic("t", cfg); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %s", name, err, name)
		}
	}
	c := TopicConfig{MaxMessages: 10, MaxBytes: 100}
	for _, x := range []struct {
		msgs, bytes int64
		over        bool
	}{{10, 100, false}, {11, 0, true}, {0, 101, true}, {5, 50, false}} {
		if got := c.OverSize(x.msgs, x.bytes); got != x.over {
			t.Errorf("OverSize(%d, %d) = %v", x.msgs, x.bytes, got)
		}
	}
	if (TopicConfig{}).OverSize(1<<40, 1<<40) || (TopicConfig{}).HasSizeBound() {
		t.Error("no bound: never over")
	}
}

// TestParamsCheck: the Check methods refuse nil parameters and the fields that are wrong whatever
// the state with ErrInvalidArgument, and accept good ones.
func TestParamsCheck(t *testing.T) {
	firstErr := func(_ any, err error) error { return err }
	bad := map[string]error{
		"nil BindingCreate":       firstErr((*BindingCreateParams)(nil).Check()),
		"binding group":           firstErr((&BindingCreateParams{Group: "not valid", Pattern: "a.*"}).Check()),
		"binding pattern":         firstErr((&BindingCreateParams{Group: "g", Pattern: "a.#.b"}).Check()),
		"binding start":           firstErr((&BindingCreateParams{Group: "g", Pattern: "a.*", Start: StartPosition{Kind: "X"}}).Check()),
		"nil BindingDelete":       (*BindingDeleteParams)(nil).Check(),
		"nil DeliveriesAck":       (*DeliveriesAckParams)(nil).Check(),
		"nil DeliveriesClaim":     (*DeliveriesClaimParams)(nil).Check(),
		"claim max 0":             (&DeliveriesClaimParams{Member: "m"}).Check(),
		"claim without member":    (&DeliveriesClaimParams{Max: 1}).Check(),
		"claim negative lease":    (&DeliveriesClaimParams{Max: 1, Member: "m", LeaseDuration: -1}).Check(),
		"nil DeliveriesExtend":    (*DeliveriesExtendParams)(nil).Check(),
		"extend negative":         (&DeliveriesExtendParams{Duration: -1}).Check(),
		"nil DeliveriesNack":      (*DeliveriesNackParams)(nil).Check(),
		"nack negative delay":     (&DeliveriesNackParams{Delay: -1}).Check(),
		"give-back to the DLQ":    (&DeliveriesNackParams{GiveBack: "i", ToDLQ: true}).Check(),
		"give-back of batches":    (&DeliveriesNackParams{GiveBack: "i", Batch: true}).Check(),
		"give-back tag too long":  (&DeliveriesNackParams{GiveBack: strings.Repeat("i", MaxGroupNameLen+1)}).Check(),
		"claim skip too long":     (&DeliveriesClaimParams{Max: 1, Member: "m", Skip: "i", SkipFor: MaxSkipFor + 1}).Check(),
		"claim skip negative":     (&DeliveriesClaimParams{Max: 1, Member: "m", Skip: "i", SkipFor: -1}).Check(),
		"nil DeliveriesRelease":   (*DeliveriesReleaseParams)(nil).Check(),
		"release without member":  (&DeliveriesReleaseParams{}).Check(),
		"nil DLQList":             (*DLQListParams)(nil).Check(),
		"DLQ list negative limit": (&DLQListParams{Limit: -1}).Check(),
		"nil DLQPurge":            (*DLQPurgeParams)(nil).Check(),
		"nil DLQReplay":           (*DLQReplayParams)(nil).Check(),
		"nil SubscriptionCreate":  firstErr((*SubscriptionCreateParams)(nil).Check()),
		"nil SubscriptionUpdate":  (*SubscriptionUpdateParams)(nil).Check(),
		"unknown state":           (&SubscriptionUpdateParams{State: "SLEEPING"}).Check(),
		"nil TopicCreate":         firstErr((*TopicCreateParams)(nil).Check()),
		"topic create bad name":   firstErr((&TopicCreateParams{Name: "a b"}).Check()),
		"nil TopicDelete":         (*TopicDeleteParams)(nil).Check(),
		"topic delete bad name":   (&TopicDeleteParams{Name: "a b"}).Check(),
		"nil TopicUpdate":         firstErr((*TopicUpdateParams)(nil).Check()),
		"topic update bad config": firstErr((&TopicUpdateParams{Name: "t", Config: TopicConfig{Partitions: -1}}).Check()),
	}
	for what, err := range bad {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", what, err)
		}
	}
	good := map[string]error{
		"binding":   firstErr((&BindingCreateParams{Group: "g", Pattern: "a.*"}).Check()),
		"claim":     (&DeliveriesClaimParams{Max: 1, Member: "m", Partitions: []int32{0}}).Check(),
		"extend":    (&DeliveriesExtendParams{}).Check(),
		"nack":      (&DeliveriesNackParams{ToDLQ: true}).Check(),
		"give-back": (&DeliveriesNackParams{GiveBack: "i", Delay: time.Second}).Check(),
		"skip":      (&DeliveriesClaimParams{Max: 1, Member: "m", Skip: "i", SkipFor: MaxSkipFor}).Check(),
		"release":   (&DeliveriesReleaseParams{Member: "m"}).Check(),
		"DLQ list":  (&DLQListParams{}).Check(),
		"state":     (&SubscriptionUpdateParams{State: Paused}).Check(),
		"create":    firstErr((&TopicCreateParams{Name: "t"}).Check()),
		"delete":    (&TopicDeleteParams{Name: "t"}).Check(),
		"update":    firstErr((&TopicUpdateParams{Name: "t"}).Check()),
		"ack":       (&DeliveriesAckParams{}).Check(),
		"purge":     (&DLQPurgeParams{}).Check(),
		"replay":    (&DLQReplayParams{}).Check(),
		"unbinding": (&BindingDeleteParams{}).Check(),
	}
	for what, err := range good {
		if err != nil {
			t.Errorf("%s: %v, want no error", what, err)
		}
	}
	if err := (*DeliveriesAckParams)(nil).Check(); err == nil || err.Error() != "invalid argument: nil params" {
		t.Errorf("nil params error: %v", err)
	}
}

// TestCanTransitionIsSeed000: exactly seed 000's transitions are allowed (its state machine,
// adopted Open Question 1); PAUSED -> DEAD in particular is not one of them.
func TestCanTransitionIsSeed000(t *testing.T) {
	valid := map[[2]SubscriptionState]bool{
		{Active, Paused}: true, {Paused, Active}: true, {Active, Dead}: true, {Dead, Active}: true,
		{Active, Cancelled}: true, {Paused, Cancelled}: true, {Dead, Cancelled}: true, {Cancelled, Deleted}: true,
	}
	states := []SubscriptionState{Active, Paused, Dead, Cancelled, Deleted, "BOGUS"}
	for _, from := range states {
		for _, to := range states {
			if got := CanTransition(from, to); got != valid[[2]SubscriptionState{from, to}] {
				t.Errorf("CanTransition(%s, %s) = %v", from, to, got)
			}
		}
	}
}

func TestPoisonRulesValidate(t *testing.T) {
	t.Parallel()
	def := TopicConfig{PoisonRules: PoisonRules{MaxFailures: 3}}.WithDefaults()
	if def.PoisonRules.Window != DefaultPoisonWindow || def.Validate() != nil {
		t.Fatalf("max_failures 3 alone: window %s, error %v; want %s, nil", def.PoisonRules.Window, def.Validate(), DefaultPoisonWindow)
	}
	if (TopicConfig{}).WithDefaults().PoisonRules.On() {
		t.Fatal("poison rules on by default")
	}
	for _, r := range []PoisonRules{
		{MaxFailures: -1}, {MaxFailures: MaxFailureHistory + 1, Window: time.Second},
		{MaxFailures: 2, Window: time.Microsecond}, {MaxFailures: 2, Window: 25 * time.Hour}, {Window: time.Second},
	} {
		err := TopicConfig{PoisonRules: r}.WithDefaults().Validate()
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "poison_rules.") {
			t.Errorf("%+v: error %v, want ErrInvalidArgument naming poison_rules", r, err)
		}
	}
}

// TestRefcountStart: a joiner skips the prefix that the other subscriptions completed (done by
// one of them within [start, floor), below every live floor), and nothing else.
func TestRefcountStart(t *testing.T) {
	for name, c := range map[string]struct {
		want           int64
		starts, floors []int64
		live           []bool
		got            int64
	}{
		"alone":                {want: 0, got: 0},
		"one live done":        {want: 0, starts: []int64{0}, floors: []int64{5}, live: []bool{true}, got: 5},
		"start above":          {want: 7, starts: []int64{0}, floors: []int64{5}, live: []bool{true}, got: 7},
		"lowest live floor":    {want: 0, starts: []int64{0, 0}, floors: []int64{5, 3}, live: []bool{true, true}, got: 3},
		"dead does not hold":   {want: 0, starts: []int64{0, 0}, floors: []int64{5, 1}, live: []bool{true, false}, got: 5},
		"dead completed alone": {want: 0, starts: []int64{0}, floors: []int64{4}, live: []bool{false}, got: 4},
		"nobody did the gap":   {want: 0, starts: []int64{3}, floors: []int64{6}, live: []bool{true}, got: 0},
		"chained ranges":       {want: 0, starts: []int64{0, 2}, floors: []int64{3, 8}, live: []bool{false, true}, got: 8},
		"gap between ranges":   {want: 0, starts: []int64{0, 4}, floors: []int64{3, 8}, live: []bool{false, true}, got: 3},
	} {
		if got := RefcountStart(c.want, c.starts, c.floors, c.live); got != c.got {
			t.Errorf("%s: RefcountStart = %d, want %d", name, got, c.got)
		}
	}
}

// TestRefcountSkips: above the joiner's start, the offsets every live other subscription has done
// and one has done at or above its start are skipped, as runs.
func TestRefcountSkips(t *testing.T) {
	others := []RefcountOther{
		{Start: 0, Floor: 0, Live: true, Above: [][2]int64{{1, 3}, {4, 5}, {6, 7}}},
		{Start: 0, Floor: 0, Live: true, Above: [][2]int64{{2, 3}, {4, 7}}},
		{Start: 5, Floor: 5, Live: false}, // DEAD, started at 5: done below its start only
	}
	got := RefcountSkips(0, 8, others)
	want := [][2]int64{{2, 3}, {4, 5}, {6, 7}}
	if !slices.Equal(got, want) {
		t.Errorf("RefcountSkips = %v, want %v", got, want)
	}
	if got := RefcountSkips(0, 8, others[2:]); got != nil {
		t.Errorf("RefcountSkips with only a subscription that started later = %v, want none", got)
	}
	if got := RefcountSkips(0, 8, nil); got != nil {
		t.Errorf("RefcountSkips alone = %v, want none", got)
	}
}

// TestRefcountSkipsWideWindow: the cost of RefcountSkips is in the others' runs, not in the
// window: a joiner landing 2^50 offsets below the log end (a per-offset walk would never end)
// gets its runs at once.
func TestRefcountSkipsWideWindow(t *testing.T) {
	const end = int64(1) << 50
	others := []RefcountOther{
		{Start: 0, Floor: 10, Live: true, Above: [][2]int64{{20, 30}, {end - 5, end - 1}}},
		{Start: 0, Floor: 0, Live: false, Above: [][2]int64{{25, end}}},
	}
	want := [][2]int64{{20, 30}, {end - 5, end - 1}}
	if got := RefcountSkips(10, end, others); !slices.Equal(got, want) {
		t.Errorf("RefcountSkips = %v, want %v", got, want)
	}
}

// TestRefcountSkipsPerOffset: the run-based RefcountSkips agrees with its definition read offset
// by offset, on random subscriptions.
func TestRefcountSkipsPerOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := range 2000 {
		others := make([]RefcountOther, rng.IntN(4))
		for i := range others {
			h := &others[i]
			h.Start, h.Floor, h.Live = rng.Int64N(20), rng.Int64N(30), rng.IntN(3) > 0
			for o := h.Floor; o < 40; o += 1 + rng.Int64N(4) {
				hi := o + 1 + rng.Int64N(3)
				h.Above = append(h.Above, [2]int64{o, hi})
				o = hi
			}
		}
		from, to := rng.Int64N(25), rng.Int64N(45)
		var want [][2]int64
		for o := from; o < to && len(others) > 0; o++ {
			complete, someone := true, false
			for _, h := range others {
				done := o < h.Floor || slices.ContainsFunc(h.Above, func(r [2]int64) bool { return r[0] <= o && o < r[1] })
				complete = complete && (!h.Live || done)
				someone = someone || done && o >= h.Start
			}
			if !complete || !someone {
				continue
			}
			if n := len(want); n > 0 && want[n-1][1] == o {
				want[n-1][1] = o + 1
			} else {
				want = append(want, [2]int64{o, o + 1})
			}
		}
		if got := RefcountSkips(from, to, others); !slices.Equal(got, want) {
			t.Fatalf("case %d: RefcountSkips(%d, %d, %+v) = %v, want %v", c, from, to, others, got, want)
		}
	}
}
