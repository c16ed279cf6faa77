// Package admin is the Go client of Spool's HTTP admin API (/api/v1, JSON; docs in the server's
// /api/v1/openapi.json): topics, consumer groups (create, update, remove, resurrect,
// force-complete, backfill, rebalance), message completion records and the cleanup jobs. The
// package client speaks the binary protocol for publishing and consuming; this one is for operators'
// tools and applications that manage groups.
//
//	c, err := admin.NewClient("https://spool.example.com:8080", nil, admin.WithToken(token))
//	g, err := c.CreateGroup(ctx, "orders.created", admin.CreateGroupRequest{
//		Group: "audit", Start: admin.StartPosition{Kind: admin.FromBeginning}})
//	var ae *admin.APIError
//	if errors.As(err, &ae) && ae.Code == "SUBSCRIPTION_EXISTS" { ... }
//
// The types of this package are the API's JSON bodies: the server encodes and decodes these very
// types, so their fields are the wire format. Errors: an error answer is an *APIError carrying
// the API's code (TOPIC_NOT_FOUND, INVALID_TRANSITION, ... as in docs/protocol.md section 9.2);
// a request that got no answer is an *UnreachableError. Routes without a method of their own
// are reachable with Client.Call. A Client is safe for concurrent use.
package admin
