package shards

// Binary min-heaps over slices of values. container/heap passes every
// element through an interface, which allocates for a value bigger than a
// pointer (a delayed entry is 16 bytes): these do not.

func heapPush[T any](h []T, x T, less func(a, b T) bool) []T {
	h = append(h, x)
	heapUp(h, len(h)-1, less)
	return h
}

// heapRemove removes element i and returns it with the shorter heap.
func heapRemove[T any](h []T, i int, less func(a, b T) bool) (T, []T) {
	var zero T
	n := len(h) - 1
	x := h[i]
	if i != n {
		h[i] = h[n]
		h[n] = zero
		h = h[:n]
		if !heapDown(h, i, less) {
			heapUp(h, i, less)
		}
		return x, h
	}
	h[n] = zero
	return x, h[:n]
}

func heapUp[T any](h []T, j int, less func(a, b T) bool) {
	for j > 0 {
		i := (j - 1) / 2
		if !less(h[j], h[i]) {
			break
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

// heapDown sifts element i0 down and reports whether it moved.
func heapDown[T any](h []T, i0 int, less func(a, b T) bool) bool {
	i, n := i0, len(h)
	for {
		l := 2*i + 1
		if l >= n || l < 0 {
			break
		}
		j := l
		if r := l + 1; r < n && less(h[r], h[l]) {
			j = r
		}
		if !less(h[j], h[i]) {
			break
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
	return i > i0
}
