package changelog

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Assembler puts records back together from the messages of CTX_STATE, read
// in stream order. It keeps the pieces of each partition's record in
// progress.
type Assembler struct {
	pieces map[int][][]byte
}

// NewAssembler returns an empty Assembler.
func NewAssembler() *Assembler { return &Assembler{pieces: map[int][][]byte{}} }

// Add takes the next message of partition p. It returns the record's bytes
// when the message completes one (complete true), or nothing when it is a
// piece. Pieces of a run that never completed are dropped when the next run
// starts. A message with neither header, or with numbers out of order, is
// an error (the caller skips it).
func (a *Assembler) Add(p int, h nats.Header, data []byte) (record []byte, complete bool, err error) {
	if k := h.Get(PieceHeader); k != "" {
		i, err := strconv.Atoi(k)
		if err != nil || i < 1 {
			delete(a.pieces, p)
			return nil, false, fmt.Errorf("bad %s %q", PieceHeader, k)
		}
		if i == 1 {
			a.pieces[p] = nil
		}
		if len(a.pieces[p]) != i-1 {
			delete(a.pieces, p)
			return nil, false, fmt.Errorf("piece %d of partition %d out of order", i, p)
		}
		a.pieces[p] = append(a.pieces[p], data)
		return nil, false, nil
	}
	n, err := strconv.Atoi(h.Get(PiecesHeader))
	if err != nil || n < 1 {
		delete(a.pieces, p)
		return nil, false, fmt.Errorf("bad %s %q", PiecesHeader, h.Get(PiecesHeader))
	}
	prev := a.pieces[p]
	delete(a.pieces, p)
	if n == 1 {
		return data, true, nil
	}
	if len(prev) != n-1 {
		return nil, false, fmt.Errorf("record of partition %d has %d pieces of %d", p, len(prev)+1, n)
	}
	size := len(data)
	for _, b := range prev {
		size += len(b)
	}
	out := make([]byte, 0, size)
	for _, b := range prev {
		out = append(out, b...)
	}
	return append(out, data...), true, nil
}

// fill takes partition p's next message into item: a piece, the record it
// completes (decoded, and checked to be p's), or why it cannot be read.
func (a *Assembler) fill(item *Item, p int, h nats.Header, data []byte) {
	data, complete, err := a.Add(p, h, data)
	switch {
	case err != nil:
		item.Err = err
	case !complete:
		item.Piece = true
	default:
		rec, err := Decode(data)
		if err == nil && rec.Partition != p {
			err = fmt.Errorf("record of partition %d on the subject of %d", rec.Partition, p)
		}
		if err != nil {
			item.Err = err
		} else {
			item.Record = &rec
		}
	}
}

// Drop forgets partition p's pieces (the reader skipped their record).
func (a *Assembler) Drop(p int) { delete(a.pieces, p) }

// Pending tells whether partition p has pieces of an unfinished record.
func (a *Assembler) Pending(p int) bool { return len(a.pieces[p]) > 0 }
