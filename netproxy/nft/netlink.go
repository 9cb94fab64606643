package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Netlink is the Ruleset (proxy.Ruleset) that programs the kernel's outpost table over
// nftables netlink. Apply sends a whole Tx as one batch, which the kernel
// commits atomically; rules are translated into the expressions nft(8)
// itself would generate, so `nft list table inet outpost` reads like the
// statements' String forms.
//
// The socket that sends batches stays open between them (Close closes
// it): the kernel, when an nftables netlink socket is closed, waits for
// the objects earlier commits deleted to be freed, an RCU grace period
// (about 10 ms here), so a socket per batch made every sync that deleted
// a rule or an element take that long.
type Netlink struct {
	netns int
	mu    sync.Mutex // one batch at a time; guards sock
	sock  *mnl.Conn  // nil until the first batch, and after a failed one
}

// NewNetlink returns a Netlink for the network namespace netnsFD refers
// to; 0 means the current one. It does not touch the kernel.
func NewNetlink(netnsFD int) *Netlink {
	return &Netlink{netns: netnsFD}
}

// conn returns an nftables connection to the netns, for reading the
// table.
func (n *Netlink) conn() (*nftables.Conn, error) {
	var opts []nftables.ConnOption
	if n.netns != 0 {
		opts = append(opts, nftables.WithNetNSFd(n.netns))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

// Apply sends tx to the kernel as one batch: either all of it takes
// effect or none does. The batch begins by creating the table if it is
// missing (and re-creates it after an OpDelTable that more ops follow).
// An empty Tx sends nothing.
//
// Rules and elements, most of a big Tx, are laid out straight into the
// batch (encodeRule, batchEncoder.elems); google/nftables translates the
// other ops, chunkOps at a time, and its messages are copied into the batch as
// they come. So the messages of a whole cold sync (10,000 Services:
// 140,000 ops) never exist beside the batch.
func (n *Netlink) Apply(tx *Tx) error {
	if tx == nil || len(tx.Ops) == 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b := &nlBatch{t: table()}
	buf, release := batchBuffer(len(tx.Ops) * bytesPerOp)
	defer release()
	enc := batchEncoder{buf: buf}
	// Rules and elements (most of a big Tx) are laid out here, straight
	// into the batch: Conn's AddRule and SetAddElements copy each one's
	// bytes several times over. The other ops go through google/nftables,
	// a chunk at a time.
	var c *nftables.Conn
	var msgs *[]mnl.Message
	inConn := 0
	conn := func() error {
		if c == nil {
			var err error
			if c, msgs, err = captureConn(); err != nil {
				return err
			}
			b.c = c
		}
		return nil
	}
	flush := func() error {
		if c == nil {
			return nil
		}
		if err := c.Flush(); !errors.Is(err, errBatchMarshalled) {
			return fmt.Errorf("marshal: %w", err)
		}
		enc.add(*msgs)
		c, inConn = nil, 0
		return nil
	}
	// The table first (so that deleting a missing one succeeds), and
	// again after an OpDelTable that more ops follow.
	if err := conn(); err != nil {
		return fmt.Errorf("apply tx: %w", err)
	}
	c.AddTable(b.t)
	wantTable := false
	for i := 0; i < len(tx.Ops); {
		op := tx.Ops[i]
		if wantTable && op.Kind != OpDelTable {
			if err := conn(); err != nil {
				return fmt.Errorf("apply tx: %w", err)
			}
			c.AddTable(b.t)
			wantTable = false
		}
		switch op.Kind {
		case OpAddRule, OpAddElem, OpDelElem:
			if err := flush(); err != nil {
				return fmt.Errorf("apply tx: %w", err)
			}
			next := i + 1
			var err error
			if op.Kind == OpAddRule {
				err = b.encodeRule(&enc, op)
			} else {
				var els []nftables.SetElement
				if els, next, err = elemRun(tx.Ops, i); err == nil {
					enc.elems(op.Kind, b.t.Name, op.Map.Name, els)
				}
			}
			if err != nil {
				return fmt.Errorf("apply tx: op %d (%s): %w", i, op.String(), err)
			}
			i = next
			continue
		case OpDelTable:
			wantTable = true
		}
		if err := conn(); err != nil {
			return fmt.Errorf("apply tx: %w", err)
		}
		if err := b.add(op); err != nil {
			return fmt.Errorf("apply tx: op %d (%s): %w", i, op.String(), err)
		}
		i++
		if inConn++; inConn >= chunkOps {
			if err := flush(); err != nil {
				return fmt.Errorf("apply tx: %w", err)
			}
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("apply tx: %w", err)
	}
	if err := n.send(&enc); err != nil {
		return fmt.Errorf("apply tx of %d ops to table %s: %w", len(tx.Ops), TableName, err)
	}
	return nil
}

// encodeRule lays out OpAddRule op in the batch, as google/nftables'
// AddRule would: the table, the chain, the expressions and the comment.
func (b *nlBatch) encodeRule(e *batchEncoder, op Op) error {
	exprs, err := b.rule(op.Rule)
	if err != nil {
		return err
	}
	start := e.begin(mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWRULE), mnl.Request|mnl.Create|unix.NLM_F_APPEND)
	e.buf = append(e.buf, unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0)
	e.attrString(unix.NFTA_RULE_TABLE, b.t.Name)
	e.attrString(unix.NFTA_RULE_CHAIN, op.Chain.Name)
	list := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS)
	for _, x := range exprs {
		if err := e.expr(byte(b.t.Family), x); err != nil {
			return fmt.Errorf("marshal %T: %w", x, err)
		}
	}
	e.endNest(list)
	if op.Rule.Comment != "" {
		e.attr(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, op.Rule.Comment))
	}
	e.finishMsg(start)
	return nil
}

// captureConn returns a Conn whose Flush marshals what was added to it
// into *msgs (batch begin and end included) and ends with
// errBatchMarshalled instead of sending.
func captureConn() (*nftables.Conn, *[]mnl.Message, error) {
	msgs := new([]mnl.Message)
	c, err := nftables.New(nftables.WithTestDial(func(req []mnl.Message) ([]mnl.Message, error) {
		*msgs = req
		return nil, errBatchMarshalled
	}))
	if err != nil {
		return nil, nil, err
	}
	return c, msgs, nil
}

// batchBuffer returns an empty buffer of capacity n for a batch, and the
// func that frees it once the batch is sent. A big one (a cold sync) is
// mapped outside the Go heap, with transparent huge pages where the
// kernel gives them on request, and unmapped at once after: faulting in
// tens of MiB of fresh 4 KiB heap pages was a good part of a cold sync,
// and the heap kept them.
func batchBuffer(n int) ([]byte, func()) {
	if n < bigBatch {
		return make([]byte, 0, n), func() {}
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, 0, n), func() {}
	}
	unix.Madvise(mem, unix.MADV_HUGEPAGE)
	return mem[:0], func() { unix.Munmap(mem) }
}

// bigBatch is the size from which batchBuffer maps a buffer of its own.
const bigBatch = 4 << 20

// chunkOps is how many ops google/nftables translates at a time.
const chunkOps = 4096

// bytesPerOp is a batch's first guess at its size per op (a rule of a
// Service chain is some 300 bytes, an element some 60).
const bytesPerOp = 256

// errBatchMarshalled ends google/nftables' Flush once it has marshalled
// a batch into netlink messages: Apply sends them itself (see send). It
// reads as a permission error because that is the error Flush returns
// at once, without reading one acknowledgement per message first.
var errBatchMarshalled = batchMarshalled{}

type batchMarshalled struct{}

func (batchMarshalled) Error() string { return "batch marshalled" }

func (batchMarshalled) Is(target error) bool { return target == os.ErrPermission }

// batchEncoder lays out one batch as the kernel reads it, in one buffer:
// the batch begin message, the messages of every chunk, and (by finish)
// the batch end. It numbers the messages from 1: each batch has a socket
// of its own.
type batchEncoder struct {
	buf   []byte
	n     int // messages so far
	last  int // offset of the last message but the batch end
	begun bool
	end   mnl.Message
}

// add appends a chunk's messages, dropping its batch begin and end but
// for the first begin, and keeping the end for finish.
func (e *batchEncoder) add(msgs []mnl.Message) {
	if len(msgs) < 2 {
		return
	}
	if !e.begun {
		e.append(msgs[0])
		e.begun = true
	}
	for _, m := range msgs[1 : len(msgs)-1] {
		e.append(m)
	}
	e.end = msgs[len(msgs)-1]
}

// append lays out m, without the flags asking for an acknowledgement or
// an echo (see send).
func (e *batchEncoder) append(m mnl.Message) {
	start := e.begin(m.Header.Type, m.Header.Flags&^(mnl.Acknowledge|unix.NLM_F_ECHO))
	e.buf = append(e.buf, m.Data...)
	e.finishMsg(start)
	e.pad()
}

// begin starts a message of type typ, numbered next, for finishMsg to
// complete, and makes it the last message (see finish); it returns the
// message's offset.
func (e *batchEncoder) begin(typ mnl.HeaderType, flags mnl.HeaderFlags) int {
	start := len(e.buf)
	e.n++
	e.last = start
	e.buf = binary.NativeEndian.AppendUint32(e.buf, 0) // length, by finishMsg
	e.buf = binary.NativeEndian.AppendUint16(e.buf, uint16(typ))
	e.buf = binary.NativeEndian.AppendUint16(e.buf, uint16(flags))
	e.buf = binary.NativeEndian.AppendUint32(e.buf, uint32(e.n))
	e.buf = binary.NativeEndian.AppendUint32(e.buf, 0)
	return start
}

// finishMsg sets the length of the message begun at start.
func (e *batchEncoder) finishMsg(start int) {
	binary.NativeEndian.PutUint32(e.buf[start:], uint32(len(e.buf)-start))
}

// attr appends a netlink attribute, padded.
func (e *batchEncoder) attr(typ uint16, data []byte) {
	e.buf = binary.NativeEndian.AppendUint16(e.buf, uint16(unix.NLA_HDRLEN+len(data)))
	e.buf = binary.NativeEndian.AppendUint16(e.buf, typ)
	e.buf = append(e.buf, data...)
	e.pad()
}

// attrString appends a NUL-terminated string attribute.
func (e *batchEncoder) attrString(typ uint16, s string) {
	e.buf = binary.NativeEndian.AppendUint16(e.buf, uint16(unix.NLA_HDRLEN+len(s)+1))
	e.buf = binary.NativeEndian.AppendUint16(e.buf, typ)
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, 0)
	e.pad()
}

// beginNest starts a nested attribute and returns its offset for
// endNest.
func (e *batchEncoder) beginNest(typ uint16) int {
	at := len(e.buf)
	e.buf = binary.NativeEndian.AppendUint16(e.buf, 0)
	e.buf = binary.NativeEndian.AppendUint16(e.buf, typ)
	return at
}

// endNest sets the length of the nested attribute begun at at.
func (e *batchEncoder) endNest(at int) {
	binary.NativeEndian.PutUint16(e.buf[at:], uint16(len(e.buf)-at))
}

func (e *batchEncoder) pad() {
	for len(e.buf)%unix.NLA_ALIGNTO != 0 {
		e.buf = append(e.buf, 0)
	}
}

// expr appends x as an element of a rule's expression list, in the
// bytes expr.Marshal gives (TestEncoderExprMatchesMarshal), written in
// place for the kinds a Service's rules are made of and by expr.Marshal
// for the others.
func (e *batchEncoder) expr(fam byte, x expr.Any) error {
	elem := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM)
	data := func(name string) int {
		e.attrString(unix.NFTA_EXPR_NAME, name)
		return e.beginNest(unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA)
	}
	switch x := x.(type) {
	case *expr.Meta:
		d := data("meta")
		e.attrU32(unix.NFTA_META_KEY, uint32(x.Key))
		if x.SourceRegister {
			e.attrU32(unix.NFTA_META_SREG, x.Register)
		} else {
			e.attrU32(unix.NFTA_META_DREG, x.Register)
		}
		e.endNest(d)
	case *expr.Cmp:
		d := data("cmp")
		e.attrU32(unix.NFTA_CMP_SREG, x.Register)
		e.attrU32(unix.NFTA_CMP_OP, uint32(x.Op))
		v := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_CMP_DATA)
		e.attr(unix.NFTA_DATA_VALUE, x.Data)
		e.endNest(v)
		e.endNest(d)
	case *expr.Payload:
		if x.OperationType == expr.PayloadWrite || x.CsumType > 0 {
			return e.exprMarshal(fam, x, elem)
		}
		d := data("payload")
		e.attrU32(unix.NFTA_PAYLOAD_DREG, x.DestRegister)
		e.attrU32(unix.NFTA_PAYLOAD_BASE, uint32(x.Base))
		e.attrU32(unix.NFTA_PAYLOAD_OFFSET, x.Offset)
		e.attrU32(unix.NFTA_PAYLOAD_LEN, x.Len)
		e.endNest(d)
	case *expr.Numgen:
		if x.Type != unix.NFT_NG_RANDOM && x.Type != unix.NFT_NG_INCREMENTAL {
			return e.exprMarshal(fam, x, elem)
		}
		d := data("numgen")
		e.attrU32(unix.NFTA_NG_DREG, x.Register)
		e.attrU32(unix.NFTA_NG_MODULUS, x.Modulus)
		e.attrU32(unix.NFTA_NG_TYPE, x.Type)
		e.attrU32(unix.NFTA_NG_OFFSET, x.Offset)
		e.endNest(d)
	case *expr.Immediate:
		d := data("immediate")
		e.attrU32(unix.NFTA_IMMEDIATE_DREG, x.Register)
		v := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_IMMEDIATE_DATA)
		e.attr(unix.NFTA_DATA_VALUE, x.Data)
		e.endNest(v)
		e.endNest(d)
	case *expr.Verdict:
		d := data("immediate")
		e.attrU32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
		v := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_IMMEDIATE_DATA)
		vv := e.beginNest(unix.NLA_F_NESTED | unix.NFTA_DATA_VERDICT)
		e.attrU32(unix.NFTA_VERDICT_CODE, uint32(x.Kind))
		if x.Chain != "" {
			e.attrString(unix.NFTA_VERDICT_CHAIN, x.Chain)
		}
		e.endNest(vv)
		e.endNest(v)
		e.endNest(d)
	case *expr.NAT:
		if x.Random || x.Persistent || x.Prefix || x.RegAddrMax != 0 || x.RegProtoMax != 0 {
			return e.exprMarshal(fam, x, elem)
		}
		d := data("nat")
		e.attrU32(unix.NFTA_NAT_TYPE, uint32(x.Type))
		e.attrU32(unix.NFTA_NAT_FAMILY, x.Family)
		if x.RegAddrMin != 0 {
			e.attrU32(unix.NFTA_NAT_REG_ADDR_MIN, x.RegAddrMin)
		}
		if x.RegProtoMin != 0 {
			e.attrU32(unix.NFTA_NAT_REG_PROTO_MIN, x.RegProtoMin)
		}
		var flags uint32
		if x.FullyRandom {
			flags |= expr.NF_NAT_RANGE_PROTO_RANDOM_FULLY
		}
		if x.Specified {
			flags |= expr.NF_NAT_RANGE_PROTO_SPECIFIED
		}
		if flags != 0 {
			e.attrU32(unix.NFTA_NAT_FLAGS, flags)
		}
		e.endNest(d)
	default:
		return e.exprMarshal(fam, x, elem)
	}
	e.endNest(elem)
	return nil
}

// exprMarshal completes the list element begun at elem with
// expr.Marshal's bytes for x.
func (e *batchEncoder) exprMarshal(fam byte, x expr.Any, elem int) error {
	b, err := expr.Marshal(fam, x)
	if err != nil {
		return err
	}
	e.buf = append(e.buf, b...)
	e.endNest(elem)
	return nil
}

// attrU32 appends a big-endian 32-bit attribute.
func (e *batchEncoder) attrU32(typ uint16, v uint32) {
	e.buf = binary.NativeEndian.AppendUint16(e.buf, unix.NLA_HDRLEN+4)
	e.buf = binary.NativeEndian.AppendUint16(e.buf, typ)
	e.buf = binary.BigEndian.AppendUint32(e.buf, v)
}

// finish appends the batch end, has the last message before it ask for
// an acknowledgement, and returns that message's sequence number and the
// number of messages in the batch. ok is false when the batch holds
// nothing between begin and end.
func (e *batchEncoder) finish() (seq uint32, msgs int, ok bool) {
	if e.last == 0 {
		return 0, e.n, false
	}
	flags := binary.NativeEndian.Uint16(e.buf[e.last+6:])
	binary.NativeEndian.PutUint16(e.buf[e.last+6:], flags|uint16(mnl.Acknowledge))
	seq = binary.NativeEndian.Uint32(e.buf[e.last+8:])
	e.append(e.end)
	return seq, e.n, true
}

// commitTimeout bounds the wait for the kernel's answer to a batch. The
// kernel processes and commits a batch within the sendmsg that sends it,
// so its answer is queued by the time the wait starts; the bound is for a
// kernel that never answers.
const commitTimeout = 30 * time.Second

// send sends the batch in one sendmsg and returns the kernel's verdict:
// nil when the batch was committed, else the errors of the messages it
// refused (every one of them, as the kernel reports them).
//
// google/nftables asks for an acknowledgement of every message and an
// echo of every rule, which at 10,000 Services is some 240,000 replies
// to build, queue and read, one recvmsg each: the largest part of a cold
// sync. The kernel reports a failed message whether asked or not, and
// sends the acknowledgements it owes only once the whole batch has been
// committed or aborted, so only the last message asks for one: when it
// comes, every error came before it. (mdlayher/netlink's SendMessages
// would also lay the batch out again by appending each message to a
// growing buffer, which at 70 MB copied it several times over.)
func (n *Netlink) send(e *batchEncoder) (err error) {
	last, msgs, ok := e.finish()
	if !ok {
		return nil // begin and end only
	}
	if n.sock == nil {
		if n.sock, err = mnl.Dial(unix.NETLINK_NETFILTER, &mnl.Config{NetNS: n.netns}); err != nil {
			n.sock = nil
			return fmt.Errorf("open nftables netlink: %w", err)
		}
	}
	c := n.sock
	defer func() {
		// After a failure answers may still be queued: the next batch
		// gets a socket of its own.
		if err != nil {
			c.Close()
			n.sock = nil
		}
	}()
	if err := setBufferSize(c, max(bufferSize(msgs), len(e.buf)+len(e.buf)/8)); err != nil {
		return err
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.Sendmsg(int(fd), e.buf, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
	}); err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("send batch of %d messages (%d bytes): %w", msgs, len(e.buf), serr)
	}
	e.buf = nil // the kernel has it all
	var errs error
	// A socket's deadline is the kernel's, on the real clock.
	wall := clock.Real{}
	deadline := wall.Now().Add(commitTimeout)
	for {
		if err := c.SetReadDeadline(deadline); err != nil {
			return fmt.Errorf("netlink read deadline: %w", err)
		}
		replies, err := c.Receive()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			if errs != nil {
				return errs
			}
			return fmt.Errorf("no answer to a batch of %d messages in %s", msgs, commitTimeout)
		case errors.Is(err, unix.ENOBUFS):
			return errors.Join(errs, fmt.Errorf("read the kernel's answer: %w", err))
		case err != nil:
			// An error answer, one refused message. The others (and the
			// last message's acknowledgement, when the failure was not
			// its own) were queued with it.
			errs = errors.Join(errs, err)
			deadline = wall.Now().Add(100 * time.Millisecond)
			continue
		}
		for _, m := range replies {
			if m.Header.Type == mnl.Error && m.Header.Sequence == last {
				return errs
			}
		}
	}
}

// Close closes the socket kept between batches; a later Apply opens
// another.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sock == nil {
		return nil
	}
	err := n.sock.Close()
	n.sock = nil
	return err
}

// List returns the names of the table's chains, maps and sets, sorted; a
// missing table holds nothing.
func (n *Netlink) List() (Contents, error) {
	var out Contents
	c, err := n.conn()
	if err != nil {
		return out, fmt.Errorf("list table %s: %w", TableName, err)
	}
	t, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("list table %s: %w", TableName, err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return out, fmt.Errorf("list chains of table %s: %w", TableName, err)
	}
	for _, ch := range chains {
		if ch.Table.Name == TableName {
			out.Chains = append(out.Chains, ch.Name)
		}
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return out, fmt.Errorf("list sets of table %s: %w", TableName, err)
	}
	for _, s := range sets {
		switch {
		case s.Anonymous:
		case s.IsMap, !s.Dynamic:
			// Verdict maps, and the plain sets whose elements Txs add.
			out.Maps = append(out.Maps, s.Name)
		default:
			out.Sets = append(out.Sets, s.Name)
		}
	}
	slices.Sort(out.Chains)
	slices.Sort(out.Maps)
	slices.Sort(out.Sets)
	return out, nil
}

// Elements returns the number of elements of the table's set or map
// named name (it reads them all: for checks, not for the sync path).
func (n *Netlink) Elements(name string) (int, error) {
	c, err := n.conn()
	if err != nil {
		return 0, fmt.Errorf("list elements of %s: %w", name, err)
	}
	t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	s, err := c.GetSetByName(t, name)
	if err != nil {
		return 0, fmt.Errorf("list elements of %s: %w", name, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return 0, fmt.Errorf("list elements of %s: %w", name, err)
	}
	return len(els), nil
}

// nlBatch translates ops into the messages of one batch: rules by
// encodeRule, the ops that are neither rules nor elements by add, on c.
type nlBatch struct {
	c *nftables.Conn
	t *nftables.Table
}

// add adds op, which is neither a rule nor an element, to c.
func (b *nlBatch) add(op Op) error {
	switch op.Kind {
	case OpDelTable:
		b.c.DelTable(b.t)
	case OpAddChain:
		if err := CheckName("chain", op.Chain.Name); err != nil {
			return err
		}
		ch, err := b.chain(op.Chain)
		if err != nil {
			return err
		}
		b.c.AddChain(ch)
	case OpFlushChain:
		b.c.FlushChain(&nftables.Chain{Name: op.Chain.Name, Table: b.t})
	case OpDelChain:
		b.c.DelChain(&nftables.Chain{Name: op.Chain.Name, Table: b.t})
	case OpAddMap:
		if err := CheckName("map", op.Map.Name); err != nil {
			return err
		}
		kt, err := nlKeyType(op.Map.Key)
		if err != nil {
			return err
		}
		s := &nftables.Set{Table: b.t, Name: op.Map.Name, IsMap: true, Concatenation: true, KeyType: kt, DataType: nftables.TypeVerdict}
		if v6, ok := op.Map.endpointFamily(); ok {
			addr := nftables.TypeIPAddr
			if v6 {
				addr = nftables.TypeIP6Addr
			}
			s.DataType = nftables.MustConcatSetType(addr, nftables.TypeInetService)
		}
		if op.Map.Set && op.Map.Key.Endpoint() {
			return fmt.Errorf("set %s: an endpoint key needs a map", op.Map.Name)
		}
		if op.Map.Set {
			s = &nftables.Set{Table: b.t, Name: op.Map.Name, Concatenation: true, KeyType: kt}
		}
		if err := b.c.AddSet(s, nil); err != nil {
			return fmt.Errorf("add map: %w", err)
		}
	case OpDelMap:
		b.c.DelSet(&nftables.Set{Table: b.t, Name: op.Map.Name})
	case OpAddSet:
		if err := CheckName("set", op.Set.Name); err != nil {
			return err
		}
		if op.Set.Timeout < 0 {
			return fmt.Errorf("timeout %s is negative", op.Set.Timeout)
		}
		s := &nftables.Set{Table: b.t, Name: op.Set.Name, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true, Timeout: op.Set.Timeout, Size: AffinitySetSize}
		if op.Set.V6 {
			s.KeyType = nftables.TypeIP6Addr
		}
		if err := b.c.AddSet(s, nil); err != nil {
			return fmt.Errorf("add set: %w", err)
		}
	case OpDelSet:
		b.c.DelSet(&nftables.Set{Table: b.t, Name: op.Set.Name})
	default:
		return fmt.Errorf("unknown op kind %d", int(op.Kind))
	}
	return nil
}

// maxElemBytes bounds the element list of one message: its length is a
// 16-bit netlink attribute length, so a list past
// 64 KiB (about 800 elements with long chain names) overflows and the
// kernel refuses the whole batch.
const maxElemBytes = 48 << 10

// elemBytes estimates what one element adds to a message: key, verdict
// and attribute headers, and the chain name of a jump or goto.
func elemBytes(op Op) int {
	if op.Data.IsValid() {
		return 96 // an IPv6 endpoint key and its data
	}
	return 64 + len(op.Verdict.Chain)
}

// elemRun translates ops[i] and the ops after it of the same kind on the
// same map, up to maxElemBytes, and returns the elements and the index of
// the next op.
func elemRun(ops []Op, i int) ([]nftables.SetElement, int, error) {
	first := ops[i]
	var els []nftables.SetElement
	j, size := i, 0
	for ; j < len(ops) && ops[j].Kind == first.Kind && ops[j].Map == first.Map && (j == i || size+elemBytes(ops[j]) <= maxElemBytes); j++ {
		size += elemBytes(ops[j])
		key, err := nlElemKey(first.Map.Key, ops[j].Key)
		if err != nil {
			return nil, 0, fmt.Errorf("op %d: %w", j, err)
		}
		el := nftables.SetElement{Key: key}
		switch {
		case first.Map.Set || first.Map.Key.Endpoint():
			if ops[j].Verdict != (Verdict{}) {
				return nil, 0, fmt.Errorf("op %d: element of %s with verdict %s", j, first.Map.Name, ops[j].Verdict)
			}
			if first.Kind != OpAddElem {
				break
			}
			if err := first.Map.CheckData(ops[j].Data); err != nil {
				return nil, 0, fmt.Errorf("op %d: element %s of %s: %w", j, ops[j].Key.Format(first.Map.Key), first.Map.Name, err)
			}
			if d := ops[j].Data; d.IsValid() {
				el.Val = binary.BigEndian.AppendUint16(d.Addr().AsSlice(), d.Port())
				el.Val = append(el.Val, 0, 0)
			}
		case first.Kind == OpAddElem:
			v, err := nlVerdict(ops[j].Verdict)
			if err != nil {
				return nil, 0, fmt.Errorf("op %d: %w", j, err)
			}
			el.VerdictData = v
		}
		els = append(els, el)
	}
	return els, j, nil
}

// elems lays out in the batch the message that google/nftables'
// SetAddElements (kind OpAddElem) or SetDeleteElements (OpDelElem) makes
// of els for the set or map named set (TestEncoderElemsMatchGoogle).
func (e *batchEncoder) elems(kind OpKind, table, set string, els []nftables.SetElement) {
	typ := unix.NFT_MSG_NEWSETELEM
	if kind == OpDelElem {
		typ = unix.NFT_MSG_DELSETELEM
	}
	start := e.begin(mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|typ), mnl.Request|mnl.Create)
	e.buf = append(e.buf, unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0)
	e.attrString(unix.NFTA_SET_NAME, set)
	e.attrU32(unix.NFTA_LOOKUP_SET_ID, 0)
	e.attrString(unix.NFTA_SET_TABLE, table)
	list := e.beginNest(unix.NFTA_SET_ELEM_LIST_ELEMENTS | unix.NLA_F_NESTED)
	for i, v := range els {
		item := e.beginNest(uint16(i+1) | unix.NLA_F_NESTED)
		k := e.beginNest(unix.NFTA_SET_ELEM_KEY | unix.NLA_F_NESTED)
		e.attr(unix.NFTA_DATA_VALUE, v.Key)
		e.endNest(k)
		if v.Val != nil {
			d := e.beginNest(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
			e.attr(unix.NFTA_DATA_VALUE, v.Val)
			e.endNest(d)
		}
		if v.VerdictData != nil {
			d := e.beginNest(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
			dd := e.beginNest(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
			e.attrU32(unix.NFTA_DATA_VALUE, uint32(v.VerdictData.Kind))
			if v.VerdictData.Chain != "" {
				e.attrString(unix.NFTA_SET_ELEM_DATA, v.VerdictData.Chain)
			}
			e.endNest(dd)
			e.endNest(d)
		}
		e.endNest(item)
	}
	e.endNest(list)
	e.finishMsg(start)
}

func (b *nlBatch) chain(c Chain) (*nftables.Chain, error) {
	ch := &nftables.Chain{Name: c.Name, Table: b.t}
	if c.Base == nil {
		return ch, nil
	}
	switch c.Base.Type {
	case ChainTypeNAT:
		ch.Type = nftables.ChainTypeNAT
	case ChainTypeFilter:
		ch.Type = nftables.ChainTypeFilter
	default:
		return nil, fmt.Errorf("unknown chain type %q", c.Base.Type)
	}
	switch c.Base.Hook {
	case HookPrerouting:
		ch.Hooknum = nftables.ChainHookPrerouting
	case HookInput:
		ch.Hooknum = nftables.ChainHookInput
	case HookForward:
		ch.Hooknum = nftables.ChainHookForward
	case HookOutput:
		ch.Hooknum = nftables.ChainHookOutput
	case HookPostrouting:
		ch.Hooknum = nftables.ChainHookPostrouting
	default:
		return nil, fmt.Errorf("unknown hook %q", c.Base.Hook)
	}
	ch.Priority = nftables.ChainPriorityRef(nftables.ChainPriority(c.Base.Priority))
	return ch, nil
}

// nlKeyType is the set key type of a map key type.
func nlKeyType(k KeyType) (nftables.SetDatatype, error) {
	switch k {
	case KeyAddr4ProtoPort:
		return nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService), nil
	case KeyAddr6ProtoPort:
		return nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService), nil
	case KeyProtoPort:
		return nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService), nil
	case KeyAddr4Pair:
		return nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr), nil
	case KeyAddr6Pair:
		return nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeIP6Addr), nil
	case KeyAddr4ProtoPortIndex:
		return nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark), nil
	case KeyAddr6ProtoPortIndex:
		return nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark), nil
	case KeyProtoPortIndex:
		return nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark), nil
	}
	return nftables.SetDatatype{}, fmt.Errorf("unknown key type %q", k)
}

// nlElemKey encodes a map key as the kernel stores concatenations: each
// field padded to a multiple of 4 bytes.
func nlElemKey(kt KeyType, k MapKey) ([]byte, error) {
	if kt.Pair() {
		v6 := kt == KeyAddr6Pair
		if !k.Addr.IsValid() || !k.Addr2.IsValid() || k.Addr.Is6() != v6 || k.Addr2.Is6() != v6 || k.Addr.Is4In6() || k.Addr2.Is4In6() {
			return nil, fmt.Errorf("key %s: map %s needs two %s addresses", k, kt, AddrType(v6))
		}
		if k.Protocol != "" || k.Port != 0 {
			return nil, fmt.Errorf("key %s: map %s takes no protocol or port", k, kt)
		}
		return append(k.Addr.AsSlice(), k.Addr2.AsSlice()...), nil
	}
	if k.Addr2.IsValid() {
		return nil, fmt.Errorf("key %s: map %s takes one address", k, kt)
	}
	if k.Index != 0 && !kt.Endpoint() {
		return nil, fmt.Errorf("key %s: map %s takes no index", k, kt)
	}
	proto, ok := l4proto[strings.ToUpper(k.Protocol)]
	if !ok {
		return nil, fmt.Errorf("key %s: protocol %q: want TCP, UDP or SCTP", k, k.Protocol)
	}
	var key []byte
	switch kt {
	case KeyAddr4ProtoPort, KeyAddr4ProtoPortIndex:
		if !k.Addr.Is4() {
			return nil, fmt.Errorf("key %s: map %s needs an IPv4 address", k, kt)
		}
		key = k.Addr.AsSlice()
	case KeyAddr6ProtoPort, KeyAddr6ProtoPortIndex:
		if !k.Addr.Is6() || k.Addr.Is4In6() {
			return nil, fmt.Errorf("key %s: map %s needs an IPv6 address", k, kt)
		}
		key = k.Addr.AsSlice()
	case KeyProtoPort, KeyProtoPortIndex:
		if k.Addr.IsValid() {
			return nil, fmt.Errorf("key %s: map %s takes no address", k, kt)
		}
	default:
		return nil, fmt.Errorf("unknown key type %q", kt)
	}
	key = append(key, proto, 0, 0, 0)
	key = binary.BigEndian.AppendUint16(key, k.Port)
	key = append(key, 0, 0)
	if kt.Endpoint() {
		// numgen writes its draw in host byte order.
		key = binary.NativeEndian.AppendUint32(key, k.Index)
	}
	return key, nil
}

func nlVerdict(v Verdict) (*expr.Verdict, error) {
	e := &expr.Verdict{Chain: v.Chain}
	switch v.Kind {
	case VerdictAccept:
		e.Kind = expr.VerdictAccept
	case VerdictDrop:
		e.Kind = expr.VerdictDrop
	case VerdictReturn:
		e.Kind = expr.VerdictReturn
	case VerdictJump:
		e.Kind = expr.VerdictJump
	case VerdictGoto:
		e.Kind = expr.VerdictGoto
	default:
		return nil, fmt.Errorf("unknown verdict %q", v.Kind)
	}
	if (v.Chain != "") != (v.Kind == VerdictJump || v.Kind == VerdictGoto) {
		return nil, fmt.Errorf("verdict %q: only jump and goto take a chain, and they need one", v)
	}
	return e, nil
}

// AffinitySetSize bounds an affinity set (nft's default for a set that
// rules update, which the kernel would report anyway).
const AffinitySetSize = 65535

// bytesPerMessage is the socket buffer a batch needs per message: its
// share of the batch (sent in one sendmsg) and of the error answers, in
// case all of it is refused: the kernel queues them all at once after
// the abort, and each costs its skb's true size, not its length.
const bytesPerMessage = 2048

// socketBuffer is the netlink socket's least send and receive buffer
// size. The whole batch is one sendmsg, which fails with EMSGSIZE beyond
// the send buffer, and the kernel's answers overflow a small receive
// buffer with ENOBUFS.
const socketBuffer = 8 << 20

// bufferSize is the socket buffer size for a batch of msgs messages: at
// least socketBuffer, at most 1 GiB.
func bufferSize(msgs int) int {
	return min(max(socketBuffer, msgs*bytesPerMessage), 1<<30)
}

// setBufferSize raises the socket's send and receive buffers to size. The
// FORCE options (CAP_NET_ADMIN) go past net.core.rmem_max/wmem_max;
// without the capability the plain options apply, capped by those limits.
func setBufferSize(c *mnl.Conn, size int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	var forced error
	err = raw.Control(func(fd uintptr) {
		forced = errors.Join(
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size),
		)
	})
	if err == nil && forced == nil {
		return nil
	}
	if err := c.SetReadBuffer(size); err != nil {
		return fmt.Errorf("set netlink receive buffer: %w", err)
	}
	if err := c.SetWriteBuffer(size); err != nil {
		return fmt.Errorf("set netlink send buffer: %w", err)
	}
	return nil
}

// Registers. A concatenation is loaded into consecutive 32-bit registers
// starting at the (16-byte) register 1, which is 32-bit register 0; the
// 32-bit registers are numbered from nlReg32 on.
const (
	nlReg1       = 1
	nlReg2       = 2 // the 16-byte register after an IPv6 address in register 1
	nlReg32      = 8 // NFT_REG32_00, the same storage as register 1
	nlRegPort    = 9
	nlRegV4Proto = nlReg32 + 1 // after 4 bytes of IPv4 address
	nlRegV4Port  = nlReg32 + 2
	nlRegV6Port  = nlReg32 + 5 // after 16 bytes of address and 4 of protocol
)

// ruleEncoder collects a rule's expressions. In the inet family every
// load of an IPv4 or IPv6 header field needs `meta nfproto` before it (nft
// adds it implicitly); rule adds it before each statement that loads one
// (StmtInfo.Family) unless the rule already established the family.
type ruleEncoder struct {
	exprs  []expr.Any
	family int // 4 or 6 once established
}

func (e *ruleEncoder) add(x ...expr.Any) { e.exprs = append(e.exprs, x...) }

// needFamily establishes the family fam (4 or 6).
func (e *ruleEncoder) needFamily(fam int) {
	if e.family != fam {
		e.add(matchFamily(fam == 4)...)
		e.family = fam
	}
}

// rule translates a rule's statements, each by its encode (stmt.go).
func (b *nlBatch) rule(r Rule) ([]expr.Any, error) {
	var e ruleEncoder
	for i, s := range r.Stmts {
		if i > 0 && r.Stmts[i-1].Info().Terminal {
			return nil, fmt.Errorf("statement %d (%s) follows a terminal statement", i, stmtString(s))
		}
		if s == nil || reflect.TypeOf(s).Kind() == reflect.Pointer {
			return nil, fmt.Errorf("statement %d: unsupported statement type %T", i, s)
		}
		if fam := s.Info().Family; fam != 0 {
			e.needFamily(fam)
		}
		if err := s.encode(&e); err != nil {
			return nil, fmt.Errorf("statement %d (%s): %w", i, s, err)
		}
	}
	return e.exprs, nil
}

// nlLoadSaddr is `ip saddr` or `ip6 saddr` into register 1.
func nlLoadSaddr(v6 bool) expr.Any {
	if v6 {
		return &expr.Payload{DestRegister: nlReg1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6SaddrOffset, Len: 16}
	}
	return &expr.Payload{DestRegister: nlReg1, Base: expr.PayloadBaseNetworkHeader, Offset: ip4SaddrOffset, Len: 4}
}

// nlMapLookup is `[ip daddr .] meta l4proto . th dport vmap @map`: the key's
// fields in consecutive registers from register 1, then the lookup.
func nlMapLookup(s MapLookup) ([]expr.Any, error) {
	l4 := func(protoReg, portReg uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: protoReg},
			&expr.Payload{DestRegister: portReg, Base: expr.PayloadBaseTransportHeader, Offset: thDportOffset, Len: 2},
		}
	}
	var e []expr.Any
	switch s.Key {
	case KeyAddr4ProtoPort:
		e = append(e, &expr.Payload{DestRegister: nlReg1, Base: expr.PayloadBaseNetworkHeader, Offset: ip4DaddrOffset, Len: 4})
		e = append(e, l4(nlRegV4Proto, nlRegV4Port)...)
	case KeyAddr6ProtoPort:
		e = append(e, &expr.Payload{DestRegister: nlReg1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6DaddrOffset, Len: 16})
		e = append(e, l4(nlReg2, nlRegV6Port)...)
	case KeyProtoPort:
		e = append(e, l4(nlReg1, nlRegPort)...)
	case KeyAddr4Pair:
		e = append(e,
			&expr.Payload{DestRegister: nlReg32, Base: expr.PayloadBaseNetworkHeader, Offset: ip4SaddrOffset, Len: 4},
			&expr.Payload{DestRegister: nlReg32 + 1, Base: expr.PayloadBaseNetworkHeader, Offset: ip4DaddrOffset, Len: 4},
		)
	case KeyAddr6Pair:
		e = append(e,
			&expr.Payload{DestRegister: nlReg1, Base: expr.PayloadBaseNetworkHeader, Offset: ip6SaddrOffset, Len: 16},
			&expr.Payload{DestRegister: nlReg2, Base: expr.PayloadBaseNetworkHeader, Offset: ip6DaddrOffset, Len: 16},
		)
	default:
		return nil, fmt.Errorf("unknown key type %q", s.Key)
	}
	return append(e, &expr.Lookup{SourceRegister: nlReg1, SetName: s.Map, IsDestRegSet: true, DestRegister: 0}), nil
}
