// Instruction counting for virtual time (docs/virtual-time.md, "Handler cost"): spinc's
// --count-instructions builds a second native object of a package whose every function adds
// the instructions a modelled HPU would execute to the exported counter `spin_instructions`.
//
// Why the IR and not the x86 code: the modelled HPU is PsPIN's scalar 32-bit RISC-V core
// (RI5CY), a load/store machine like LLVM IR; x86's memory operands and vector instructions
// would count one instruction where the HPU executes several. The IR is clang's optimised IR
// without vectorisation (the HPU has no SIMD), so the count is of the code the optimiser left.
// What each IR instruction costs is `ir_cost` below, an RV32IMF estimate: the calibrated
// cycles-per-instruction of the NIC model (emu::nic_model::cpi) absorbs the rest.
//
// Bulk copies: a call of llvm.memcpy / memmove / memset (what __builtin_memcpy and struct
// copies become) is charged as an RV32 word loop, 2 instructions per 4 bytes (1 to set), and
// spinc's own memcpy, memmove and memset are not instrumented, so they are not charged twice.
//
// How: each basic block adds its cost to a per-function accumulator (an alloca that mem2reg
// turns into registers), in segments that end at each call, and the accumulator goes to the
// global before every call that is not an intrinsic and before every return. So the counter is
// exact at every spin API call (the runtime reads it there to time the call: the instructions
// before the call, the call included) and when a handler returns, and a loop pays one register
// add per iteration, not a memory update.
#include "icount.hpp"
#include "ir_io.hpp"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Dominators.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/PromoteMemToReg.h>

#include <vector>

namespace spin::cc {
namespace {

// Bits of a scalar or of each lane; 32 for pointers (the HPU's width).
unsigned lane_bits(llvm::Type* t) {
  if (auto* v = llvm::dyn_cast<llvm::VectorType>(t)) t = v->getElementType();
  if (t->isPointerTy()) return 32;
  return t->isSized() ? static_cast<unsigned>(t->getPrimitiveSizeInBits().getFixedValue()) : 32;
}

// Lanes of a vector type (1 for a scalar): each lane is a scalar instruction on the HPU.
std::uint64_t lanes(llvm::Type* t) {
  if (auto* v = llvm::dyn_cast<llvm::FixedVectorType>(t)) return v->getNumElements();
  return 1;
}

// Words of 32 bits a value of `t` takes (a 64-bit value is two registers on RV32).
std::uint64_t words(llvm::Type* t) {
  const unsigned b = lane_bits(t);
  return lanes(t) * (b > 32 ? (b + 31) / 32 : 1);
}

// A bulk copy or clear: llvm.memcpy / memmove / memset, or a call of spinc's memcpy, memmove or
// memset (which are not instrumented themselves).
bool is_bulk(const llvm::CallBase& c) {
  if (const auto* ii = llvm::dyn_cast<llvm::IntrinsicInst>(&c)) {
    const auto id = ii->getIntrinsicID();
    return id == llvm::Intrinsic::memcpy || id == llvm::Intrinsic::memmove || id == llvm::Intrinsic::memset;
  }
  const llvm::Function* f = c.getCalledFunction();
  return f != nullptr && c.arg_size() == 3 && (f->getName() == "memcpy" || f->getName() == "memmove" || f->getName() == "memset");
}

bool is_set(const llvm::CallBase& c) {
  if (const auto* ii = llvm::dyn_cast<llvm::IntrinsicInst>(&c)) return ii->getIntrinsicID() == llvm::Intrinsic::memset;
  return c.getCalledFunction()->getName() == "memset";
}

// Instructions an RV32IMF core executes for `i`, estimated; variable-length memory intrinsics
// are counted at run time (instrument()).
std::uint64_t ir_cost(const llvm::Instruction& i) {
  using llvm::Instruction;
  if (llvm::isa<llvm::PHINode>(i) || llvm::isa<llvm::AllocaInst>(i)) return 0;  // registers, the frame
  if (const auto* ii = llvm::dyn_cast<llvm::IntrinsicInst>(&i)) {
    switch (ii->getIntrinsicID()) {
    case llvm::Intrinsic::memcpy:
    case llvm::Intrinsic::memmove:
    case llvm::Intrinsic::memset:
      if (const auto* n = llvm::dyn_cast<llvm::ConstantInt>(ii->getArgOperand(2))) {
        const std::uint64_t w = (n->getZExtValue() + 3) / 4;  // a word loop: load and store per word
        return ii->getIntrinsicID() == llvm::Intrinsic::memset ? w : 2 * w;
      }
      return 0;  // counted at run time
    case llvm::Intrinsic::lifetime_start:
    case llvm::Intrinsic::lifetime_end:
    case llvm::Intrinsic::assume:
    case llvm::Intrinsic::dbg_declare:
    case llvm::Intrinsic::dbg_value:
    case llvm::Intrinsic::dbg_label:
    case llvm::Intrinsic::experimental_noalias_scope_decl:
      return 0;
    default:
      if (!i.getType()->isVoidTy()) return words(i.getType());
      return ii->arg_size() > 0 ? words(ii->getArgOperand(0)->getType()) : 1;
    }
  }
  switch (i.getOpcode()) {
  case Instruction::BitCast:
  case Instruction::PtrToInt:
  case Instruction::IntToPtr:
  case Instruction::Trunc:
  case Instruction::Freeze:
  case Instruction::Unreachable:
    return 0;  // no instruction on a 32-bit core (the value is already in its register)
  case Instruction::GetElementPtr: {
    // Constant offsets fold into the load or store; a variable index is an add (its scaling
    // folds into a pointer that a loop steps, as the back end's strength reduction makes it).
    const auto& g = llvm::cast<llvm::GetElementPtrInst>(i);
    std::uint64_t n = 0;
    for (auto it = g.idx_begin(); it != g.idx_end(); ++it)
      if (!llvm::isa<llvm::Constant>(*it)) n += 1;
    return n;
  }
  case Instruction::Mul:
    return lane_bits(i.getType()) > 32 ? 4 * lanes(i.getType()) : lanes(i.getType());
  case Instruction::UDiv:
  case Instruction::SDiv:
  case Instruction::URem:
  case Instruction::SRem:
    return lane_bits(i.getType()) > 32 ? 40 * lanes(i.getType()) : lanes(i.getType());  // RV32 has no 64-bit divide
  case Instruction::Switch:
    return 2 * llvm::cast<llvm::SwitchInst>(i).getNumCases() / 3 + 2;  // a compare tree, about
  case Instruction::Store:
    return words(llvm::cast<llvm::StoreInst>(i).getValueOperand()->getType());
  case Instruction::ICmp:
  case Instruction::FCmp:
    return words(i.getOperand(0)->getType());
  case Instruction::Call: {
    const auto& c = llvm::cast<llvm::CallBase>(i);
    if (is_bulk(c)) {  // spinc's memcpy/memmove/memset: a word loop (counted at run time when n varies)
      const auto* n = llvm::dyn_cast<llvm::ConstantInt>(c.getArgOperand(2));
      if (n == nullptr) return 1;
      const std::uint64_t w = (n->getZExtValue() + 3) / 4;
      return is_set(c) ? w : 2 * w;
    }
    return 1 + c.arg_size() / 2;  // the jump, about half the arguments moved
  }
  case Instruction::Ret:
  case Instruction::Br:
    return 1;
  default:
    return i.getType()->isVoidTy() ? 1 : words(i.getType());
  }
}

// Bulk operations whose length is known only at run time: counted there.
bool counts_at_run_time(const llvm::Instruction& i) {
  const auto* c = llvm::dyn_cast<llvm::CallBase>(&i);
  return c != nullptr && is_bulk(*c) && !llvm::isa<llvm::ConstantInt>(c->getArgOperand(2));
}

// A call the counter must be exact at: anything but an intrinsic (the spin API is an indirect call).
bool flushes_before(const llvm::Instruction& i) {
  const auto* c = llvm::dyn_cast<llvm::CallBase>(&i);
  return c != nullptr && !llvm::isa<llvm::IntrinsicInst>(c);
}

void instrument(llvm::Function& f, llvm::GlobalVariable* counter) {
  llvm::LLVMContext& cx = f.getContext();
  llvm::Type* i64 = llvm::Type::getInt64Ty(cx);
  llvm::IRBuilder<> b(&*f.getEntryBlock().getFirstInsertionPt());
  llvm::AllocaInst* acc = b.CreateAlloca(i64, nullptr, "spin.icount");
  llvm::StoreInst* zero = b.CreateStore(llvm::ConstantInt::get(i64, 0), acc);

  // Each block adds its cost in segments: the instructions up to and including a call (or the
  // return) are added right before it, so the counter is exact at every call; the rest before
  // the block's terminator.
  std::vector<llvm::BasicBlock*> blocks;
  for (llvm::BasicBlock& bb : f) blocks.push_back(&bb);
  auto add = [&](llvm::Instruction* before, llvm::Value* v) {
    llvm::IRBuilder<> r(before);
    r.CreateStore(r.CreateAdd(r.CreateLoad(i64, acc), v), acc);
  };
  auto flush = [&](llvm::Instruction* before) {
    llvm::IRBuilder<> r(before);
    llvm::Value* pending = r.CreateLoad(i64, acc);
    r.CreateStore(r.CreateAdd(r.CreateLoad(i64, counter), pending), counter);
    r.CreateStore(llvm::ConstantInt::get(i64, 0), acc);
  };
  for (llvm::BasicBlock* bb : blocks) {
    std::vector<llvm::Instruction*> insts;
    for (llvm::Instruction& i : *bb)
      if (&i != acc && &i != zero && !llvm::isa<llvm::PHINode>(i)) insts.push_back(&i);
    std::uint64_t seg = 0;
    for (llvm::Instruction* i : insts) {
      seg += ir_cost(*i);
      if (counts_at_run_time(*i)) {
        // A copy of n bytes: a word loop of (n + 3) / 4 iterations, 2 instructions each (1 to set).
        llvm::IRBuilder<> r(i);
        const auto* c = llvm::cast<llvm::CallBase>(i);
        llvm::Value* n = r.CreateZExtOrTrunc(c->getArgOperand(2), i64);
        llvm::Value* w = r.CreateLShr(r.CreateAdd(n, llvm::ConstantInt::get(i64, 3)), 2);
        if (!is_set(*c)) w = r.CreateShl(w, 1);
        add(i, w);
      }
      const bool ret = llvm::isa<llvm::ReturnInst>(i);
      // After a musttail call only its return may follow: that call was flushed already.
      const bool after_musttail = ret && i->getPrevNode() != nullptr && llvm::isa<llvm::CallInst>(i->getPrevNode()) &&
                                  llvm::cast<llvm::CallInst>(i->getPrevNode())->isMustTailCall();
      if ((flushes_before(*i) || ret) && !after_musttail) {
        if (seg != 0) add(i, llvm::ConstantInt::get(i64, seg));
        seg = 0;
        flush(i);
      }
    }
    if (seg != 0) add(bb->getTerminator(), llvm::ConstantInt::get(i64, seg));
  }
  llvm::DominatorTree dt(f);
  llvm::PromoteMemToReg({acc}, dt);
}

} // namespace

result<void> instrument_ir(const std::string& in, const std::string& out) {
  return rewrite_bitcode(in, out, "instrumented", [](llvm::Module& m) -> result<void> {
    if (m.getNamedValue(instruction_counter_symbol) != nullptr)
      return fail(errc::invalid_argument, std::string("the handler file defines '") + instruction_counter_symbol +
                                              "', the name of spinc's instruction counter");
    llvm::Type* i64 = llvm::Type::getInt64Ty(m.getContext());
    // linkonce_odr: the handler's object and spinc's support object each define it; the link keeps one.
    auto* counter = new llvm::GlobalVariable(m, i64, false, llvm::GlobalValue::LinkOnceODRLinkage,
                                             llvm::ConstantInt::get(i64, 0), instruction_counter_symbol);
    counter->setComdat(m.getOrInsertComdat(instruction_counter_symbol));
    counter->setAlignment(llvm::Align(8));
    // spinc's memcpy, memmove and memset: their callers' llvm.mem* intrinsics are charged as word
    // loops (ir_cost), so their own loops (bytes, as spinc writes them) do not count again.
    for (llvm::Function& f : m)
      if (!f.isDeclaration() && f.getName() != "memcpy" && f.getName() != "memmove" && f.getName() != "memset") instrument(f, counter);
    return {};
  });
}

} // namespace spin::cc
