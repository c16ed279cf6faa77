package storage

import (
	"errors"
	"testing"
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
