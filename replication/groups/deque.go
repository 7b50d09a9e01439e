package groups

// deque is a FIFO of T on a ring that doubles when full; its memory is
// kept across pops, so a steady flow allocates nothing.
type deque[T any] struct {
	buf        []T
	head, size int
}

func (d *deque[T]) len() int { return d.size }

func (d *deque[T]) push(v T) {
	if d.size == len(d.buf) {
		nb := make([]T, max(2*len(d.buf), 16))
		for i := range d.size {
			nb[i] = d.buf[(d.head+i)%len(d.buf)]
		}
		d.buf, d.head = nb, 0
	}
	d.buf[(d.head+d.size)%len(d.buf)] = v
	d.size++
}

// front is the oldest element; the deque must not be empty.
func (d *deque[T]) front() *T { return &d.buf[d.head] }

// pop removes and returns the oldest element; the deque must not be empty.
func (d *deque[T]) pop() T {
	var zero T
	v := d.buf[d.head]
	d.buf[d.head] = zero
	d.head = (d.head + 1) % len(d.buf)
	d.size--
	return v
}
