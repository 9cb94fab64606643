package store

import "sync/atomic"

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) next() int { return int(c.n.Add(1)) }
