package fsm

import (
	"errors"
	"fmt"
)

// CommandType is the first byte of every log entry. It names the command; the second byte is the version of
// that command's payload encoding.
type CommandType uint8

// IgnoreUnknownFlag marks a command type that peers which do not know it may skip. Without the flag an unknown
// type stops the replica (it panics), because silently diverging is worse than stopping.
const IgnoreUnknownFlag CommandType = 0x80

// The command types. Numbers are part of the log format: never reuse one.
const (
	CmdNoop   CommandType = 1 // moves the revision; used by a new leader's barrier and after a restore
	CmdCreate CommandType = 2 // create a key that is not live
	CmdUpdate CommandType = 3 // replace a live key, optionally only at an expected mod revision
	CmdDelete CommandType = 4 // delete a live key, optionally only at an expected mod revision
	CmdTxn    CommandType = 5 // compares, then one of two op lists, all in one revision
	// CmdCompact drops watch history up to CompactRevision, as etcd's compaction does. Keys are untouched.
	CmdCompact CommandType = 6
)

// commandVersion is the payload encoding version written by this build.
const commandVersion = 1

// Command is one change to the store, as proposed through Raft. Time is the proposer's wall clock in Unix
// nanoseconds: the store trims its watch history by it, since Apply may not read a clock.
type Command struct {
	Type CommandType
	Time int64

	// Create, Update, Delete.
	Key                 string
	Value               []byte
	ExpectedModRevision int64 // Update and Delete: 0 means any
	ExpiresAt           int64 // Create and Update: Unix nanoseconds, 0 means never

	// CmdTxn.
	Txn *Txn

	// CmdCompact.
	CompactRevision int64
}

// Txn applies Success when every compare holds, Failure otherwise, atomically in one revision.
type Txn struct {
	Compares []Compare
	Success  []Op
	Failure  []Op
}

// CompareTarget names what a Compare looks at.
type CompareTarget uint8

const (
	CompareModRevision    CompareTarget = 1
	CompareCreateRevision CompareTarget = 2
	CompareValue          CompareTarget = 3
)

// CompareResult is the relation a Compare asserts.
type CompareResult uint8

const (
	CompareEqual    CompareResult = 1
	CompareNotEqual CompareResult = 2
	CompareLess     CompareResult = 3
	CompareGreater  CompareResult = 4
)

// Compare asserts a relation on one key. A missing key has revisions 0 and a nil value, so "create revision
// equals 0" means "does not exist", as in etcd.
type Compare struct {
	Key      string
	Target   CompareTarget
	Result   CompareResult
	Revision int64
	Value    []byte
}

// OpType is what an Op does inside a Txn.
type OpType uint8

const (
	OpGet    OpType = 1
	OpPut    OpType = 2 // create or replace; a replaced key keeps its create revision
	OpDelete OpType = 3 // delete if present
)

// Op is one operation inside a Txn.
type Op struct {
	Type      OpType
	Key       string
	Value     []byte
	ExpiresAt int64
}

// Code is the outcome of a command. It travels in results and over the forwarding RPC, so its numbers are
// part of the wire format.
type Code uint8

const (
	CodeOK            Code = 0
	CodeAlreadyExists Code = 1
	CodeNotFound      Code = 2
	CodeConflict      Code = 3
	CodeInvalid       Code = 4
)

// Errors of commands and reads. Callers compare with errors.Is.
var (
	ErrAlreadyExists = errors.New("key already exists")
	ErrNotFound      = errors.New("key not found")
	ErrConflict      = errors.New("mod revision does not match")
	ErrInvalid       = errors.New("invalid command")
	// ErrCompacted means the requested revision is older than the retained history, or the store was replaced
	// by a snapshot restore. Watchers must relist.
	ErrCompacted = errors.New("requested revision has been compacted")
	// ErrFallenBehind cuts off a watcher that did not keep up with the history ring. It is a form of
	// compaction: errors.Is(err, ErrCompacted) holds too.
	ErrFallenBehind = fmt.Errorf("watcher fell behind the retained history: %w", ErrCompacted)
)

var codeErrors = map[Code]error{
	CodeAlreadyExists: ErrAlreadyExists,
	CodeNotFound:      ErrNotFound,
	CodeConflict:      ErrConflict,
	CodeInvalid:       ErrInvalid,
}

// Result is what applying a command returned.
type Result struct {
	Revision int64 // the store's revision after the command; the Raft index when the command changed a key
	Code     Code
	// KV is the key's state after a successful Create or Update. On Conflict it is the current value, so a
	// compare-and-swap loop needs no second read. After a Delete it is the deleted value.
	KV *KeyValue
	// Txn results.
	Succeeded bool
	Responses []*KeyValue // per op: the value read (Get), the previous value (Put, Delete), or nil
}

// Err maps the result code to its error, or nil.
func (r Result) Err() error { return codeErrors[r.Code] }

// commandSpec describes one command type: how it applies to the store. The payload codec is shared.
type commandSpec struct {
	name  string
	apply func(t *applyTxn, c *Command) Result
}

var commandTable [256]*commandSpec

// registerCommand adds a command type to the table. A duplicate is a programming error.
func registerCommand(t CommandType, name string, apply func(*applyTxn, *Command) Result) {
	if commandTable[t] != nil {
		panic(fmt.Sprintf("fsm: command type %d registered twice", t))
	}
	commandTable[t] = &commandSpec{name: name, apply: apply}
}

func init() {
	registerCommand(CmdNoop, "noop", applyNoop)
	registerCommand(CmdCreate, "create", applyCreate)
	registerCommand(CmdUpdate, "update", applyUpdate)
	registerCommand(CmdDelete, "delete", applyDelete)
	registerCommand(CmdTxn, "txn", applyTxnCommand)
	registerCommand(CmdCompact, "compact", applyCompact)
}

// String names the command type, for logs and metrics.
func (t CommandType) String() string {
	if spec := commandTable[t]; spec != nil {
		return spec.name
	}
	return fmt.Sprintf("command(%d)", uint8(t))
}

// Encode returns the log entry for the command.
func (c *Command) Encode() []byte {
	e := encoder{buf: make([]byte, 0, 32+len(c.Key)+len(c.Value))}
	e.byte(byte(c.Type))
	e.byte(commandVersion)
	e.varint(c.Time)
	e.string(c.Key)
	e.bytes(c.Value)
	e.varint(c.ExpectedModRevision)
	e.varint(c.ExpiresAt)
	e.bool(c.Txn != nil)
	if c.Txn != nil {
		encodeTxn(&e, c.Txn)
	}
	e.varint(c.CompactRevision)
	return e.buf
}

// DecodeCommand parses a log entry. It checks the command type and payload version, so a forwarding peer can
// refuse garbage before proposing it.
func DecodeCommand(data []byte) (*Command, error) {
	if len(data) < 2 {
		return nil, fmt.Errorf("fsm: log entry of %d bytes is too short", len(data))
	}
	typ := CommandType(data[0])
	if commandTable[typ] == nil {
		return nil, fmt.Errorf("fsm: unknown command type %d", data[0])
	}
	if data[1] != commandVersion {
		return nil, fmt.Errorf("fsm: %s command has unsupported version %d", typ, data[1])
	}
	d := decoder{buf: data[2:]}
	c := &Command{Type: typ}
	c.Time = d.varint()
	c.Key = d.string()
	c.Value = d.bytes()
	c.ExpectedModRevision = d.varint()
	c.ExpiresAt = d.varint()
	if d.bool() {
		c.Txn = decodeTxn(&d)
	}
	c.CompactRevision = d.varint()
	if err := d.done(); err != nil {
		return nil, fmt.Errorf("fsm: decoding %s command: %w", typ, err)
	}
	return c, nil
}

func encodeTxn(e *encoder, t *Txn) {
	e.uvarint(uint64(len(t.Compares)))
	for _, c := range t.Compares {
		e.string(c.Key)
		e.byte(byte(c.Target))
		e.byte(byte(c.Result))
		e.varint(c.Revision)
		e.bytes(c.Value)
	}
	for _, ops := range [][]Op{t.Success, t.Failure} {
		e.uvarint(uint64(len(ops)))
		for _, op := range ops {
			e.byte(byte(op.Type))
			e.string(op.Key)
			e.bytes(op.Value)
			e.varint(op.ExpiresAt)
		}
	}
}

func decodeTxn(d *decoder) *Txn {
	t := &Txn{}
	n := d.count()
	for i := 0; i < n && d.err == nil; i++ {
		t.Compares = append(t.Compares, Compare{
			Key: d.string(), Target: CompareTarget(d.byte()), Result: CompareResult(d.byte()),
			Revision: d.varint(), Value: d.bytes(),
		})
	}
	for _, ops := range []*[]Op{&t.Success, &t.Failure} {
		n := d.count()
		for i := 0; i < n && d.err == nil; i++ {
			*ops = append(*ops, Op{Type: OpType(d.byte()), Key: d.string(), Value: d.bytes(), ExpiresAt: d.varint()})
		}
	}
	return t
}

// EncodeResult serializes a result for the forwarding RPC.
func EncodeResult(r Result) []byte {
	var e encoder
	e.varint(r.Revision)
	e.byte(byte(r.Code))
	encodeOptionalKV(&e, r.KV)
	e.bool(r.Succeeded)
	e.uvarint(uint64(len(r.Responses)))
	for _, kv := range r.Responses {
		encodeOptionalKV(&e, kv)
	}
	return e.buf
}

// DecodeResult parses what EncodeResult wrote.
func DecodeResult(data []byte) (Result, error) {
	d := decoder{buf: data}
	r := Result{Revision: d.varint(), Code: Code(d.byte()), KV: decodeOptionalKV(&d), Succeeded: d.bool()}
	n := d.count()
	for i := 0; i < n && d.err == nil; i++ {
		r.Responses = append(r.Responses, decodeOptionalKV(&d))
	}
	return r, d.done()
}
